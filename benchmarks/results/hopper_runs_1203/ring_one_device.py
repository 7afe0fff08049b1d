"""ring_attention on a one-device mesh (2026-12-03), with ``out_dtype.patch`` applied to the tree
(it defines ``ring._takes_out_dtype``): the steps writing o, dq, dk, dv in the input dtype
(``out_dtype``, what the patched ring passes) against float32 step outputs cast by the ring, same
run: compiled memory (XLA's memory_analysis of jax.grad) and forward+backward time (median of
--reps calls in --rounds interleaved rounds).

  git apply benchmarks/results/hopper_runs_1203/out_dtype.patch
  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1203/ring_one_device.py \
      --shapes 32:8:64@131072,32:32:128@16384 --rounds 2 --out $OUT/ring1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import ringattention
from ringattention import ring


def grad_fn(causal: bool):
    mesh = Mesh(np.array(jax.devices()[:1]), ("sp",))

    def attn(q, k, v):
        return ringattention.ring_attention(q, k, v, "sp", causal=causal,
                                            implementation="pallas_hopper")

    sm = jax.shard_map(attn, mesh=mesh, in_specs=(P(None, "sp"),) * 3, out_specs=P(None, "sp"),
                       check_vma=False)

    def loss(q, k, v, do):
        return jnp.sum(sm(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))

    return jax.jit(jax.grad(loss, (0, 1, 2)))


def compiled(causal: bool, out_dtype: bool, args):
    """The compiled gradient with the steps' out_dtype on (the ring's default now) or off."""
    real = ring._takes_out_dtype
    ring._takes_out_dtype = real if out_dtype else (lambda fn: False)
    try:
        return grad_fn(causal).lower(*args).compile()
    finally:
        ring._takes_out_dtype = real


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="32:8:64@262144,32:32:128@16384")
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="ring1")
    a = ap.parse_args()
    records = []
    for spec in a.shapes.split(","):
        shape, seq = spec.split("@")
        h, kvh, d = (int(x) for x in shape.split(":"))
        L = int(seq)
        keys = jax.random.split(jax.random.PRNGKey(L), 4)
        q, do = (jax.random.normal(r, (1, L, h, d), jnp.bfloat16) for r in keys[:2])
        k, v = (jax.random.normal(r, (1, L, kvh, d), jnp.bfloat16) for r in keys[2:])
        args = (q, k, v, do)
        fns = {m: compiled(bool(a.causal), m == "input", args) for m in ("input", "float32")}
        for mode, fn in fns.items():
            mem = fn.memory_analysis()
            rec = dict(shape=shape, seq=L, causal=bool(a.causal), outputs=mode,
                       temp_gib=mem.temp_size_in_bytes / 2**30,
                       argument_gib=mem.argument_size_in_bytes / 2**30,
                       output_gib=mem.output_size_in_bytes / 2**30, ms=[])
            records.append(rec)
            jax.block_until_ready(fn(*args))  # warm-up
        for _ in range(a.rounds):
            for rec in records[-2:]:
                fn = fns[rec["outputs"]]
                ts = []
                for _ in range(a.reps):
                    t = time.perf_counter()
                    jax.block_until_ready(fn(*args))
                    ts.append(time.perf_counter() - t)
                rec["ms"].append(statistics.median(ts) * 1e3)
        for rec in records[-2:]:
            print(f"{rec['shape']} L={L} causal={rec['causal']} outputs={rec['outputs']:7s}: "
                  f"temp {rec['temp_gib']:.2f} GiB, args {rec['argument_gib']:.2f}, out "
                  f"{rec['output_gib']:.2f}; fwd+bwd ms per round "
                  + " / ".join(f"{t:.2f}" for t in rec["ms"]), flush=True)
    with open(a.out + ".json", "w") as f:
        json.dump(dict(jax=jax.__version__, device=jax.devices()[0].device_kind,
                       records=records), f, indent=1)


if __name__ == "__main__":
    main()
