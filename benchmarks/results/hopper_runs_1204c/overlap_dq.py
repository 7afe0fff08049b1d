"""Head dim 128's default backward: the dq wgmmas issued while dk, dv are still in flight
(2026-12-04, second session).

In ``hopper_cta_dq_bwd._split_columns`` every pair waits for ``dv += p^T do, dk += ds^T q``
(``hbk.kv_update``: both issued, then one wait) before it waits for ds^T of both warpgroups and
issues the two wgmmas of its dq half tile, then waits again: the warpgroup's wgmma queue drains
twice per pair. FlashAttention-3's backward (Shah et al. 2024) issues dV, dQ and dK back to back and
waits for dQ while dK runs, so the dQ tile's trip to shared memory and its reduce-add hide behind dK.
Variants of ``_split_columns``' loop body, monkeypatched in:

* ``library``: as shipped (two drains per pair);
* ``overlap``: dv, dk issued, ds^T of both awaited, the dq half issued, then one wait for dv, dk
  (the query slot is freed) and one for dq;
* ``fa3``: dv issued, ds^T of both awaited, the dq half issued, then dk; dq awaited with dk in
  flight (``wait_n=1``), ds^T released and dq staged and reduce-added, then dk awaited and the
  query slot freed;
* ``overlap_smem``, ``fa3_smem`` (added after the run): the same orders with p^T and ds^T read by
  dv's and dk's wgmmas from shared memory (``smem_ds.py``), so that no wgmma in flight holds
  register operands (ptxas's C7519 fences, ``runs.md``);
* ``overlap_nested``, ``fa3_nested`` (added 2026-12-05, no device): the two orders with dq's
  accumulator allocated in a scope of its own where dq is issued. Allocated next to dk's and dv's
  its zeros are written after the last fence, and ptxas injects a warpgroup arrive (one C7519 note
  per loop); nested, neither order draws one (``../hopper_aot_1205/order.md``).

The interpret-mode path (CPU) computes the same sums in the same order as the library's.
(2026-12-04, fourth session: the own tiles are indexed through ``BwdConfig.own``, which leaves
them as they were unless the backward's block sizes set ``loop_descriptors``; then
``--backwards default/loop_descriptors=true`` times the orders with the descriptors built in the
loop, as ``../hopper_aot_1204/pipeline.sh`` does.) Timed
with ``../hopper_runs_1203c/kv_init.py``'s harness (bare backward step, rounds in rotated order,
gradients compared with the library's):

  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1204c/overlap_dq.py --backwards default \\
      --problems 32:32:128@16384+131072,32:8:128@131072 --variants library,overlap,fa3 \\
      --rounds 3 --out $OUT/overlap_dq

(as ``pipeline.sh`` ran it; results in ``runs.md``: both variants 2-9% slower than the library).
"""

from __future__ import annotations

import sys

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, "benchmarks/results/hopper_runs_1203c")
import kv_init  # noqa: E402

from ringattention.kernels import hopper_cta_dq_bwd as hcb  # noqa: E402
from ringattention.kernels import hopper_kernels as hk  # noqa: E402

sys.path.insert(0, "benchmarks/results/hopper_runs_1204c")
import smem_ds  # noqa: E402

F32 = jnp.float32
LIBRARY = hcb._split_columns


def _issue_dq(ops, ds_s, k_s, dw, ref, own):
    for w in range(hcb.WGS):
        ops._issue(ref, hk.Smem(ds_s.at[own(w)], transposed=True), hk.Smem(k_s.at[own(w), :, dw]))


def _variant(order: str, smem: bool = False, nested: bool = False):
    """``_split_columns`` with the pair's wgmmas issued in ``order`` ("overlap" or "fa3"); with
    ``smem``, dv's and dk's A operands (p^T, ds^T) read from shared memory, as ``smem_ds.py``'s
    ``dkv_smem``; with ``nested``, dq's accumulator allocated in a scope of its own where its
    first wgmma is issued instead of next to dk's and dv's."""

    def split_columns(c):
        cfg, ops, wg = c.cfg, c.ops, c.wg
        k_s, _, q_s, do_s = c.smem[:4]
        ds_s, dq_s, ds_ready, ds_free = c.scratch[:4]
        lo, d = c.bounds[0], k_s.shape[2]
        dw = pl.ds(wg * (d // hcb.WGS), d // hcb.WGS)
        shape = (cfg.block, d // hcb.WGS)

        def add_dq(dq, j, g):
            plgpu.barrier_arrive(ds_free)
            h, rows_q = c.dq_rows(j, g)
            ops.reduce_add(dq_s.at[wg], dq, c.outs[0].at[c.b, rows_q, h, dw])

        def body(j, carry, g, masked: bool):
            t = g * c.n + j - lo
            slot, p_t, ds_t = c.probs(t, masked, j)  # [r, c]
            pl.when(t > 0)(lambda: plgpu.barrier_wait(ds_free))
            ops.stage(ds_s.at[wg], ds_t)
            plgpu.barrier_arrive(ds_ready)
            q_t, do_t = hk.Smem(q_s.at[slot]), hk.Smem(do_s.at[slot])
            p16, ds16 = p_t.astype(q_s.dtype), ds_t.astype(q_s.dtype)
            own = lambda w: cfg.own(w, j)  # noqa: E731  (w itself unless loop_descriptors)
            if smem:  # p^T staged to the buffer smem_ds._scratch_pt appends; ds^T is staged
                ops.stage(c.scratch[-1].at[wg], p16)
                p16, ds16 = hk.Smem(c.scratch[-1].at[wg]), hk.Smem(ds_s.at[wg])
            if ops.interpret:  # the library's sums
                dk, dv = carry
                dv, dk = dv + ops._dot(p16, do_t), dk + ops._dot(ds16, q_t)
                plgpu.barrier_arrive(c.free.at[slot])
                plgpu.barrier_wait(ds_ready)
                add_dq(hcb._dq_half(ops, ds_s, k_s, dw, shape, own), j, g)
                return dk, dv

            def scope(dk_ref, dv_ref, dq_ref=None):
                dk_ref[...], dv_ref[...] = carry
                ops._issue(dv_ref, p16, do_t)
                if order == "overlap":
                    ops._issue(dk_ref, ds16, q_t)
                plgpu.barrier_wait(ds_ready)  # ds^T of both warpgroups written

                def with_dq(dq_ref):
                    _issue_dq(ops, ds_s, k_s, dw, dq_ref, own)
                    if order == "overlap":
                        plgpu.wgmma_wait(2)  # dv, dk
                        plgpu.barrier_arrive(c.free.at[slot])
                        add_dq(plgpu.wgmma_accumulator_load(dq_ref, wait_n=0), j, g)
                    else:
                        ops._issue(dk_ref, ds16, q_t)
                        add_dq(plgpu.wgmma_accumulator_load(dq_ref, wait_n=1), j, g)  # dk in flight
                        plgpu.wgmma_wait(0)
                        plgpu.barrier_arrive(c.free.at[slot])

                if nested:  # dq's accumulator allocated where its first wgmma is issued
                    pl.run_scoped(with_dq, plgpu.WGMMAAccumulatorRef(shape, F32))
                else:
                    with_dq(dq_ref)
                return (plgpu.wgmma_accumulator_load(dk_ref, wait_n=None),
                        plgpu.wgmma_accumulator_load(dv_ref, wait_n=None))

            acc = plgpu.WGMMAAccumulatorRef((cfg.rows, d), F32)
            if nested:
                return pl.run_scoped(scope, acc, acc)
            return pl.run_scoped(scope, acc, acc, plgpu.WGMMAAccumulatorRef(shape, F32))

        c.loop(body)
        pl.when(c.n > 0)(lambda: plgpu.barrier_wait(ds_free))  # observe the last phase
        ops.flush()

    return split_columns


# overlap_smem and fa3_smem were added after the run, for the next lease (smem_ds.py first); not
# run: smem_ds.py's dkv_smem, which they build on, lost by 5-31% (../hopper_runs_1204d/runs.md)
VARIANTS = {"library": LIBRARY, "overlap": _variant("overlap"), "fa3": _variant("fa3"),
            "overlap_smem": _variant("overlap", smem=True), "fa3_smem": _variant("fa3", smem=True),
            "overlap_nested": _variant("overlap", nested=True), "fa3_nested": _variant("fa3", nested=True)}


def use(name: str) -> None:
    hcb._split_columns = VARIANTS[name]
    hcb._scratch = smem_ds._scratch_pt if name.endswith("_smem") else smem_ds.LIBRARY[1]


kv_init.USE["variant"] = use
kv_init.VARIANTS = VARIANTS

if __name__ == "__main__":
    kv_init.main()
