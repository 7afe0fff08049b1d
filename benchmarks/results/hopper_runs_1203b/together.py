"""More wgmma in flight per warpgroup in the head-dim-128 backward (2026-12-03): a variant of
``hopper_cta_dq_bwd._split_columns`` that waits for both warpgroups' ds^T first and then issues
dv += p^T do, dk += ds^T q and both halves of its dq columns (4 wgmmas) before one wait, where the
library issues dv and dk, waits, then the dq pair, and waits again. The register peak is the same
(dk, dv carried; p^T, ds^T in 16-bit and the [64, 64] dq half live together instead of one after
the other). Times the bare backward step (default tiles), library against variant, in
interleaved rounds (median of --reps calls each), and compares the gradients.

  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1203b/together.py --out $OUT/together
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, "benchmarks")
import hopper_check as hc  # noqa: E402

from ringattention.kernels import hopper_cta_dq_bwd as hcb  # noqa: E402
from ringattention.kernels import hopper_kernels as hk  # noqa: E402
from ringattention.kernels import pallas_hopper as ph  # noqa: E402

LIBRARY = hcb._split_columns
F32, WGS = jnp.float32, hk.COMPUTE_WGS


def _updates(ops, carry, p_t, ds_t, q_s, do_s, ds_s, k_s, dw, dq_shape):
    """dv + p^T do, dk + ds^T q, and dq half = sum_w ds_w @ k_w[:, dw]: 4 wgmmas, one wait."""
    dk, dv = carry
    p16, ds16 = p_t.astype(q_s.dtype), ds_t.astype(q_s.dtype)
    dq_terms = [(hk.Smem(ds_s.at[w], transposed=True), hk.Smem(k_s.at[w, :, dw]))
                for w in range(WGS)]
    if ops.interpret:
        dq = sum(ops._dot(a, b) for a, b in dq_terms)
        return (dk + ops._dot(ds16, hk.Smem(q_s)), dv + ops._dot(p16, hk.Smem(do_s))), dq

    def scope(dv_ref, dk_ref, dq_ref):  # dq_ref: a fresh accumulator starts at zero
        dv_ref[...] = dv
        dk_ref[...] = dk
        for a, b in dq_terms:  # shared-memory operands only: issued first
            ops._issue(dq_ref, a, b)
        ops._issue(dv_ref, p16, hk.Smem(do_s))
        ops._issue(dk_ref, ds16, hk.Smem(q_s))
        return dv_ref[...], dk_ref[...], dq_ref[...]

    # run_scoped, not run_state (as hopper_cta_dq_bwd._dq_half: the warpgroup lowering rejects the
    # literal indices the dq terms close over as run_state outputs)
    dv, dk, dq = pl.run_scoped(scope, plgpu.WGMMAAccumulatorRef(dv.shape, F32),
                               plgpu.WGMMAAccumulatorRef(dk.shape, F32),
                               plgpu.WGMMAAccumulatorRef(dq_shape, F32))
    return (dk, dv), dq


def together(c):
    cfg, ops, wg = c.cfg, c.ops, c.wg
    k_s, _, q_s, do_s = c.smem[:4]
    ds_s, dq_s, ds_ready, ds_free = c.scratch
    lo, d = c.bounds[0], k_s.shape[2]
    dw = pl.ds(wg * (d // WGS), d // WGS)

    def body(j, carry, g, masked: bool):
        t = g * c.n + j - lo
        slot, p_t, ds_t = c.probs(t, masked)  # [r, c]
        pl.when(t > 0)(lambda: plgpu.barrier_wait(ds_free))  # both read the last ds^T
        ops.stage(ds_s.at[wg], ds_t)
        plgpu.barrier_arrive(ds_ready)
        plgpu.barrier_wait(ds_ready)  # ds^T of both warpgroups written
        carry, dq = _updates(ops, carry, p_t, ds_t, q_s.at[slot], do_s.at[slot], ds_s, k_s, dw,
                             (cfg.block, d // WGS))
        plgpu.barrier_arrive(c.free.at[slot])
        plgpu.barrier_arrive(ds_free)
        h, rows_q = c.dq_rows(j, g)
        ops.reduce_add(dq_s.at[wg], dq, c.outs[0].at[c.b, h, rows_q, dw])
        return carry

    c.loop(body)
    pl.when(c.n > 0)(lambda: plgpu.barrier_wait(ds_free))  # observe the last phase
    ops.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", default="32:32:128@16384+65536,32:8:128@65536")
    ap.add_argument("--causal", default="1,0")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="together")
    ap.add_argument("--interpret", action="store_true")
    a = ap.parse_args()
    hc.REPS["n"] = a.reps
    records = []
    for spec in a.problems.split(","):
        shape, seqs = spec.split("@")
        h, kvh, d = (int(x) for x in shape.split(":"))
        for length in (int(s) for s in seqs.split("+")):
            q, k, v, do = hc.problem(length, h, kvh, d, seed=length)
            pos = jnp.arange(length, dtype=jnp.int32)
            for causal in (x == "1" for x in a.causal.split(",")):
                kw = dict(causal=causal, softmax_scale=d**-0.5, interpret=a.interpret)
                o, lse = ph.forward_step(q, k, v, pos, pos, None, None, **kw)
                delta = jnp.einsum("bshd,bshd->bhs", o, do.astype(F32))
                args = (q, k, v, do, lse, delta)
                compiled, grads = {}, {}
                for name, fn in (("library", LIBRARY), ("together", together)):
                    hcb._split_columns = fn
                    jax.clear_caches()
                    step = jax.jit(lambda *x: ph.backward_step(*x, pos, pos, None, None, **kw))
                    compiled[name] = step.lower(*args).compile()
                    grads[name] = compiled[name](*args)
                hcb._split_columns = LIBRARY
                err = [float(jnp.linalg.norm(x - y) / jnp.linalg.norm(y))
                       for x, y in zip(grads["together"], grads["library"], strict=True)]
                times = {n: [] for n in compiled}
                for _ in range(a.rounds):
                    for n, fn in compiled.items():
                        times[n].append(hc.time_fn(fn, args, compiled=True) * 1e3)
                label = f"{shape} L={length} causal={causal}"
                print(f"bwd {label}: " + "; ".join(
                    f"{n} " + " / ".join(f"{t:.2f}" for t in ts) for n, ts in times.items())
                    + " ms; together vs library dq/dk/dv rel " + " ".join(f"{e:.1e}" for e in err),
                    flush=True)
                records.append(dict(shape=shape, seq=length, causal=causal, ms=times,
                                    rel_err_vs_library=err))
    with open(a.out + ".json", "w") as fh:
        json.dump(dict(jax=jax.__version__, device=jax.devices()[0].device_kind,
                       records=records), fh, indent=1)


if __name__ == "__main__":
    main()
