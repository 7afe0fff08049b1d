# Archived experiment (benchmarks/results/pallas_hopper_h200.md, 2026-12-01 night): run as
# devrun/overlap_dq.py from the repository root over commit 675d262 (it patches the library at run
# time, then runs benchmarks/hopper_check.py). Not part of the library; kept to reproduce.
"""Experiment: in the head-dim-128 one-dq-tile-per-CTA backward (hopper_cta_dq_bwd._split_columns),
issue dq's two wgmmas right behind dk/dv's instead of waiting for dk/dv first: issue dv, dk; wait
for ds^T of both warpgroups (while dk/dv run); issue dq = ds_0 k_0 + ds_1 k_1; wait until only the
dq groups are in flight (dk/dv done: release the q/do slot); wait for dq. The tensor cores get no
gap between dk/dv and dq (the profile's hottest compute stall: the wait after dk/dv, 8% of samples).

  python3 devrun/overlap_dq.py ARGS      # patches, then runs benchmarks/hopper_check.py ARGS
  python3 devrun/overlap_dq.py --selftest  # interpret mode vs reference + CUDA lowering (CPU)
"""
import runpy
import sys

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ringattention.kernels import hopper_cta_dq_bwd as hcd
from ringattention.kernels import hopper_fused_bwd as hfb
from ringattention.kernels import hopper_kernels as hk

F32 = jnp.float32
WGS = hk.COMPUTE_WGS


def update_and_dq(ops, carry, p_t, ds_t, q_smem, do_smem, dq_terms, shape, ready, release):
    """(dk + ds^T q, dv + p^T do), dq = sum of dq_terms [c, D/2]; ``ready`` (ds^T of both warpgroups
    written) is waited while dk/dv run, ``release`` runs once dk/dv are done (dq still in flight)."""
    dk, dv = carry
    dt = q_smem.dtype
    if ops.interpret:
        dv = dv + ops._dot(p_t.astype(dt), hk.Smem(do_smem))
        dk = dk + ops._dot(ds_t.astype(dt), hk.Smem(q_smem))
        plgpu.barrier_wait(ready)
        dq = sum(ops._dot(a, b) for a, b in dq_terms)
        release()
        return (dk, dv), dq

    def scope(refs):
        dv_ref, dk_ref, dq_ref = refs
        ops._issue(dv_ref, p_t.astype(dt), hk.Smem(do_smem))
        ops._issue(dk_ref, ds_t.astype(dt), hk.Smem(q_smem))
        plgpu.barrier_wait(ready)
        for a, b in dq_terms:
            ops._issue(dq_ref, a, b)
        plgpu.wgmma_wait(len(dq_terms))  # dv, dk done: their q/do slot can be refilled
        release()

    init = (dv, dk, ops.full(shape, 0.0))
    dv, dk, dq = pl.run_state(scope)(tuple(plgpu.WGMMAAccumulatorRef.init(x) for x in init))
    return (dk, dv), dq


def _split_columns(c: hfb.KeyCta):
    cfg, ops, wg = c.cfg, c.ops, c.wg
    k_s, _, q_s, do_s = c.smem[:4]
    ds_s, dq_s, ds_ready, ds_free = c.scratch
    lo, d = c.bounds[0], k_s.shape[2]
    dw = pl.ds(wg * (d // WGS), d // WGS)
    # traced warpgroup indices: run_state hands literal ones back as outputs, which Mosaic GPU's
    # warpgroup lowering rejects (see hcd._dq_half)
    idx = [wg * 0 + w for w in range(WGS)]
    terms = [(hk.Smem(ds_s.at[w], transposed=True), hk.Smem(k_s.at[w, :, dw])) for w in idx]

    def body(j, carry, g, masked: bool):
        t = g * c.n + j - lo
        slot, p_t, ds_t = c.probs(t, masked)  # [r, c]
        pl.when(t > 0)(lambda: plgpu.barrier_wait(ds_free))  # both read the last ds^T
        ops.stage(ds_s.at[wg], ds_t)
        plgpu.barrier_arrive(ds_ready)
        carry, dq = update_and_dq(ops, carry, p_t, ds_t, q_s.at[slot], do_s.at[slot], terms,
                                  (cfg.block, d // WGS), ds_ready,
                                  lambda: plgpu.barrier_arrive(c.free.at[slot]))  # dq [c, D/2]
        plgpu.barrier_arrive(ds_free)
        h, rows_q = c.dq_rows(j, g)
        ops.reduce_add(dq_s.at[wg], dq, c.outs[0].at[c.b, h, rows_q, dw])
        return carry

    c.loop(body)
    pl.when(c.n > 0)(lambda: plgpu.barrier_wait(ds_free))  # observe the last phase
    ops.flush()


hcd._split_columns = _split_columns

if __name__ == "__main__":
    if sys.argv[1:] == ["--selftest"]:
        sys.path.insert(0, "devrun")
        import rows_layout  # noqa: F401  (its selftest; undo its patches first)

        rows_layout.hcd._split_columns = _split_columns
        rows_layout.hcd._scratch = rows_layout._orig_scratch
        rows_layout.hbk.load_keys = rows_layout._orig_load_keys
        rows_layout.selftest()
    else:
        sys.argv = ["hopper_check.py", *sys.argv[1:]]
        runpy.run_path("benchmarks/hopper_check.py", run_name="__main__")
