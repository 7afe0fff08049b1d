"""The deterministic (two-kernel) backward's dq and dk/dv launches timed one by one under other
tiles (2026-12-03): would one of the two kernels run faster with 3 stages, 232 registers or
128-key dq blocks, where the pair was only ever tuned together? ``hopper_kernels.launch`` is
wrapped so that the launches of one eager ``backward_step`` are recorded with their inputs; each is
then timed alone (``hopper_check.time_fn``: a compile call, a warm-up, the median of --reps), in
--rounds interleaved rounds over the variants.

  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1203b/det_tiles.py --out $OUT/det_tiles
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, "benchmarks")
import hopper_check as hc  # noqa: E402

from ringattention.kernels import hopper_kernels as hk  # noqa: E402
from ringattention.kernels import pallas_hopper as ph  # noqa: E402


def launches(bs, args, kw):
    """[(jitted launch, its inputs)] of one eager backward step with ``bs``."""
    calls, real = [], hk.launch

    def spy(body, out_type, scratch, *, grid, interpret):
        fn = real(body, out_type, scratch, grid=grid, interpret=interpret)

        def wrapped(*xs):
            calls.append((jax.jit(fn), xs))
            return fn(*xs)
        return wrapped

    hk.launch = spy
    try:
        ph.backward_step(*args, block_sizes=bs, **kw)
    finally:
        hk.launch = real
    return calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="32:32:128")
    ap.add_argument("--seq", type=int, default=65536)
    ap.add_argument("--causal", default="1,0")
    ap.add_argument("--variants", default=",bwd_stages=3,registers=232,bwd_block_k=128",
                    help="field overrides of the deterministic tiles ('' = as they are)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="det_tiles")
    ap.add_argument("--interpret", action="store_true")
    a = ap.parse_args()
    hc.REPS["n"] = a.reps
    h, kvh, d = (int(x) for x in a.shape.split(":"))
    q, k, v, do = hc.problem(a.seq, h, kvh, d, seed=a.seq)
    pos = jnp.arange(a.seq, dtype=jnp.int32)
    records = []
    for causal in (c == "1" for c in a.causal.split(",")):
        kw = dict(causal=causal, softmax_scale=d**-0.5, interpret=a.interpret)
        o, lse = ph.forward_step(q, k, v, pos, pos, None, None, **kw)
        delta = jnp.einsum("bshd,bshd->bhs", o, do.astype(jnp.float32))
        args = (q, k, v, do, lse, delta, pos, pos, None, None)
        base = ph.deterministic_block_sizes(None, d, causal)
        todo = {}
        for spec in a.variants.split(","):
            over = {f: hc._field_value(x) for f, x in (p.split("=") for p in spec.split("/") if p)}
            try:
                todo[spec or "as is"] = launches(dataclasses.replace(base, **over), args, kw)
            except ValueError as e:  # e.g. a tile that does not fit the shared memory
                print(f"skip {spec}: {e}", flush=True)
        ms = {name: [[] for _ in calls] for name, calls in todo.items()}
        for _ in range(a.rounds):
            for name, calls in todo.items():
                for i, (fn, xs) in enumerate(calls):
                    ms[name][i].append(hc.time_fn(fn, xs) * 1e3)
        for name, per_launch in ms.items():
            print(f"{a.shape} L={a.seq} causal={causal} {name}: dq kernel "
                  + " / ".join(f"{t:.2f}" for t in per_launch[0]) + " ms, dk/dv kernel "
                  + " / ".join(f"{t:.2f}" for t in per_launch[1]) + " ms", flush=True)
        records.append(dict(shape=a.shape, seq=a.seq, causal=causal, launches_ms=ms))
    with open(a.out + ".json", "w") as fh:
        json.dump(dict(jax=jax.__version__, device=jax.devices()[0].device_kind,
                       records=records), fh, indent=1)


if __name__ == "__main__":
    main()
