"""The deterministic (two-kernel) backward's two launches timed one by one (2026-12-03): where its
time goes, dq kernel (3 tile matmuls per pair) against dk/dv kernel (4), next to the whole
backward step and the default fused one. ``hopper_kernels.launch`` is wrapped so that each launch
of ``hopper_backward.backward`` (run once, eagerly) is recorded with its inputs, then each is
timed alone (median of --reps calls after a warm-up).

  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1203/det_kernels.py --out $OUT/det_kernels
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, "benchmarks")
import hopper_check as hc  # noqa: E402

from ringattention.kernels import hopper_kernels as hk  # noqa: E402
from ringattention.kernels import pallas_hopper as ph  # noqa: E402


def timed(fn, args) -> float:
    """Milliseconds: ``hopper_check.time_fn`` (a compile call, a warm-up, the median of --reps)."""
    return hc.time_fn(fn, args) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="32:32:128@16384+65536")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="det_kernels")
    ap.add_argument("--interpret", action="store_true", help="CPU dry run (small --shapes)")
    a = ap.parse_args()
    hc.REPS["n"] = a.reps
    calls, real = [], hk.launch

    def spy(body, out_type, scratch, *, grid, interpret):
        fn = real(body, out_type, scratch, grid=grid, interpret=interpret)

        def wrapped(*args):
            calls.append((fn, args, grid))
            return fn(*args)
        return wrapped

    records = []
    for spec in a.shapes.split(","):
        shape, seqs = spec.split("@")
        h, kvh, d = (int(x) for x in shape.split(":"))
        for length in (int(s) for s in seqs.split("+")):
            keys = jax.random.split(jax.random.PRNGKey(length), 4)
            q, do = (jax.random.normal(r, (1, length, h, d), jnp.bfloat16) for r in keys[:2])
            k, v = (jax.random.normal(r, (1, length, kvh, d), jnp.bfloat16) for r in keys[2:])
            pos = jnp.arange(length, dtype=jnp.int32)
            for causal in (True, False):
                kw = dict(causal=causal, softmax_scale=d**-0.5, interpret=a.interpret)
                o, lse = ph.forward_step(q, k, v, pos, pos, None, None, **kw)
                delta = jnp.einsum("bshd,bshd->bhs", o, do.astype(jnp.float32))
                args = (q, k, v, do, lse, delta, pos, pos, None, None)
                det = ph.deterministic_block_sizes(None, d, causal)
                whole = {name: timed(jax.jit(lambda *x, bs=bs: ph.backward_step(
                    *x[:6], pos, pos, None, None, block_sizes=bs, **kw)), args[:6])
                    for name, bs in (("deterministic", det), ("default", None))}
                calls.clear()
                hk.launch = spy
                try:
                    ph.backward_step(*args, block_sizes=det, **kw)  # eager: records both launches
                finally:
                    hk.launch = real
                parts = [timed(jax.jit(fn), xs) for fn, xs, _ in calls]
                rec = dict(shape=shape, seq=length, causal=causal, whole_ms=whole,
                           launches_ms=parts, grids=[list(g) for _, _, g in calls])
                records.append(rec)
                print(f"{shape} L={length} causal={causal}: deterministic step "
                      f"{whole['deterministic']:.2f} ms (default {whole['default']:.2f}); "
                      "launches " + ", ".join(f"grid {g} {t:.2f} ms" for (_, _, g), t
                                              in zip(calls, parts)), flush=True)
    with open(a.out + ".json", "w") as f:
        json.dump(dict(jax=jax.__version__, device=jax.devices()[0].device_kind,
                       records=records), f, indent=1)


if __name__ == "__main__":
    main()
