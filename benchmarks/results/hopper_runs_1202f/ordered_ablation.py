"""Where BlockSizes(ordered_dq=True) loses its time: the bare forward + backward step at one shape
with parts of the dq order's protocol (``hopper_dq_order.DqOrder``) switched off, next to cuDNN,
the default (unordered) fused backward and deterministic=True's two-kernel one. Variants without
the claim (or the signal) are not deterministic; they only time the parts.

As run (``v1_ablation.txt``) against the session's first design, a semaphore per dq tile with
``claim(idx, rank, last)`` and ``settle(idx, last)``, which is not kept; ``ordered_dq.patch`` holds
the second design (progress counters, ``claim(known, g, r, wg, active)``, ``settle(wg)``), which
these patches do not fit.

* ordered: the protocol as in the library (claim: spin until the turn; settle: wait for the add
  to land, signal);
* noclaim: settle only (every add still waits to land and signals, nobody waits for a turn);
* landed: settle's wait for the add to land only (no signal, no claim);
* layout: neither (what remains: one visiting order for all key CTAs, the turn table loads).

  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1202f/ordered_ablation.py \
      --shape 32:32:128 --seq 16384 --causal 1,0 --out /tmp/res/ablation

Each variant is compiled ahead of time (``jit(...).lower(...).compile()``) after
``jax.clear_caches()``, so that a patch is traced into its own executable; then 3 interleaved
rounds of (a warm-up call, 3 timed calls, median); ratios to cuDNN per round, median over rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, "benchmarks")
import hopper_check as hc  # noqa: E402

from ringattention.kernels import hopper_dq_order as hdo  # noqa: E402
from ringattention.kernels import pallas_hopper as ph  # noqa: E402

ORIG = (hdo.DqOrder.claim, hdo.DqOrder.settle)


def _landed(self, idx, last):
    plgpu.wait_smem_to_gmem(0)


VARIANTS = {
    "ordered": {},
    "noclaim": dict(claim=lambda self, idx, rank, last: None),
    "landed": dict(claim=lambda self, idx, rank, last: None, settle=_landed),
    "layout": dict(claim=lambda self, idx, rank, last: None, settle=lambda self, idx, last: None),
}


def compiled_variants(causal: bool, d: int, args):
    out = {}
    _, cudnn_grad = hc.cudnn_fns(causal)
    out["cudnn"] = jax.jit(cudnn_grad).lower(*args).compile()
    default = ph.default_block_sizes(d, causal)
    det = ph.deterministic_block_sizes(None, d, causal)
    for name, bs in (("default", default), ("deterministic", det)):
        out[name] = jax.jit(hc.step_fns(ph, causal, bs)[1]).lower(*args).compile()
    ordered = dataclasses.replace(default, ordered_dq=True)
    for name, patch in VARIANTS.items():
        jax.clear_caches()
        hdo.DqOrder.claim, hdo.DqOrder.settle = ORIG
        for attr, fn in patch.items():
            setattr(hdo.DqOrder, attr, fn)
        try:
            out[name] = jax.jit(hc.step_fns(ph, causal, ordered)[1]).lower(*args).compile()
        finally:
            hdo.DqOrder.claim, hdo.DqOrder.settle = ORIG
    return out


def timed(fn, args, reps=3):
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shape", default="32:32:128")
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--causal", default="1,0")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="ablation")
    a = ap.parse_args()
    h, kvh, d = (int(x) for x in a.shape.split(":"))
    rng = jax.random.split(jax.random.PRNGKey(a.seq), 4)
    q, do = (jax.random.normal(r, (1, a.seq, h, d), jnp.bfloat16) for r in rng[:2])
    k, v = (jax.random.normal(r, (1, a.seq, kvh, d), jnp.bfloat16) for r in rng[2:])
    records, lines = [], [f"jax {jax.__version__}, {jax.devices()[0].device_kind}"]
    for causal in [c == "1" for c in a.causal.split(",")]:
        fns = compiled_variants(causal, d, (q, k, v, do))
        rounds = [{n: timed(f, (q, k, v, do)) for n, f in fns.items()} for _ in range(a.rounds)]
        for n in fns:
            ms = statistics.median(r[n] for r in rounds) * 1e3
            ratio = statistics.median(r["cudnn"] / r[n] for r in rounds)
            line = (f"L={a.seq} {a.shape} causal={causal} fwdbwd {n}: {ms:.2f} ms, x{ratio:.2f} of "
                    f"cuDNN ({a.rounds} rounds: " + ", ".join(f"{r[n] * 1e3:.2f}" for r in rounds)
                    + " ms)")
            print(line, flush=True)
            lines.append(line)
            records.append(dict(seq=a.seq, shape=a.shape, causal=causal, variant=n, ms=ms,
                                ratio_to_cudnn=ratio, rounds_ms=[r[n] * 1e3 for r in rounds]))
    with open(a.out + ".json", "w") as fh:
        json.dump(dict(lines=lines, records=records), fh, indent=1)
    with open(a.out + ".txt", "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
