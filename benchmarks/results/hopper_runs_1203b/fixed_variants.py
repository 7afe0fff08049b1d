"""Where the fixed-point dq backward loses its time (2026-12-03): the bare backward step
(``pallas_hopper.backward_step``, the default tiles) in four variants, each compiled once, then
timed in interleaved rounds (median of --reps calls each):

  float   the default fused backward (float32 reduce-adds);
  fixed   ``fixed_point_dq=True`` as in ``fixed_point_dq.patch`` (scale, round to nearest, int32
          adds);
  trunc   the same without the rounding (``astype`` truncates);
  f32acc  the scales streamed and multiplied in, but float32 staging and adds (isolates the
          integer conversion, staging and reduce-adds).

Needs ``fixed_point_dq.patch`` applied (``git apply``; not in the library). ``--q-scale`` multiplies
q (peaked attention); the dq of each variant is compared with the float one's. Run with
``MOSAIC_GPU_DUMP_PTXAS=1`` and the output in a file for ptxas's registers and spills
(``hopper_profile.py --ptxas``).

  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1203b/fixed_variants.py --out $OUT/variants
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
from jax import lax

sys.path.insert(0, "benchmarks")
import hopper_check as hc  # noqa: E402

from ringattention.kernels import hopper_fixed_dq as hfx  # noqa: E402
from ringattention.kernels import hopper_fused_bwd as hfb  # noqa: E402
from ringattention.kernels import pallas_hopper as ph  # noqa: E402

ORIG = (hfx.to_fixed, hfb.acc_dtype)


def patch(variant: str) -> None:
    hfx.to_fixed, hfb.acc_dtype = ORIG
    if variant == "trunc":
        hfx.to_fixed = lambda dq, s: (dq * lax.broadcast_in_dim(s, dq.shape, [0])).astype(jnp.int32)
    if variant == "f32acc":
        hfx.to_fixed = lambda dq, s: dq * lax.broadcast_in_dim(s, dq.shape, [0])
        hfb.acc_dtype = lambda cfg: jnp.float32


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="32:32:128")
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--causal", default="1,0")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default="float,fixed,trunc,f32acc")
    ap.add_argument("--out", default="variants")
    ap.add_argument("--q-scale", type=float, default=1.0, help="q times this: peaked attention")
    ap.add_argument("--interpret", action="store_true")
    a = ap.parse_args()
    hc.REPS["n"] = a.reps
    h, kvh, d = (int(x) for x in a.shape.split(":"))
    q, k, v, do = hc.problem(a.seq, h, kvh, d, seed=a.seq)
    q = (q * a.q_scale).astype(q.dtype)
    pos = jnp.arange(a.seq, dtype=jnp.int32)
    records = []
    for causal in (c == "1" for c in a.causal.split(",")):
        kw = dict(causal=causal, softmax_scale=d**-0.5, interpret=a.interpret)
        o, lse = ph.forward_step(q, k, v, pos, pos, None, None, **kw)
        delta = jnp.einsum("bshd,bshd->bhs", o, do.astype(jnp.float32))
        compiled, grads, errors = {}, {}, {}
        for variant in a.variants.split(","):
            patch(variant)
            jax.clear_caches()
            bs = dataclasses.replace(ph.default_block_sizes(d, causal),
                                     fixed_point_dq=variant != "float")
            fn = jax.jit(lambda *x, bs=bs: ph.backward_step(*x, pos, pos, None, None,
                                                             block_sizes=bs, **kw))
            print(f"compile {variant} causal={causal}", flush=True)
            compiled[variant] = fn.lower(q, k, v, do, lse, delta).compile()
            grads[variant] = compiled[variant](q, k, v, do, lse, delta)
        patch("float")
        ref = grads["float"][0].astype(jnp.float32)
        for variant, g in grads.items():
            err = float(jnp.linalg.norm(g[0] - ref) / jnp.linalg.norm(ref))
            print(f"dq {a.shape} L={a.seq} causal={causal} q_scale={a.q_scale} {variant} vs float: "
                  f"rel {err:.2e}", flush=True)
            errors.setdefault(variant, err)
        times = {v: [] for v in compiled}
        for _ in range(a.rounds):
            for variant, fn in compiled.items():
                times[variant].append(hc.time_fn(fn, (q, k, v, do, lse, delta), compiled=True) * 1e3)
        for variant, ts in times.items():
            print(f"bwd {a.shape} L={a.seq} causal={causal} {variant}: "
                  + " / ".join(f"{t:.2f}" for t in ts) + " ms", flush=True)
        records.append(dict(shape=a.shape, seq=a.seq, causal=causal, q_scale=a.q_scale, ms=times,
                            dq_rel_err_vs_float=errors))
    with open(a.out + ".json", "w") as fh:
        json.dump(dict(jax=jax.__version__, device=jax.devices()[0].device_kind,
                       records=records), fh, indent=1)


if __name__ == "__main__":
    main()
