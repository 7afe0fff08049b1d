"""Archived (2026-12-01): fwd_overlap.patch checked on CPU, run from the repo root with the patch
applied: interpret mode against the float32 reference (tests/test_pallas_hopper.py's checker) and
the CUDA lowering under both semantics.

  python benchmarks/results/hopper_runs_1201e/experiments/fwd_overlap_selftest.py
"""

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, "tests")
import test_pallas_hopper as t  # noqa: E402

from ringattention.kernels import pallas_hopper as ph  # noqa: E402

CASES = [  # (dtype, causal, where, segments, heads, kv_heads, sq, sk, dim, batch)
    ("bfloat16", True, "overlap", True, 2, 1, 72, 200, 64, 2),
    ("float16", False, "overlap", False, 2, 2, 128, 384, 128, 1),
    ("bfloat16", True, "before", False, 2, 1, 64, 128, 64, 1),  # nothing visible: lo == hi
    ("bfloat16", True, "overlap", True, 4, 2, 200, 328, 128, 1),
]
TILES = (dict(), dict(pingpong=False), dict(block_k=64, stages=3))
LOWER = [  # (head dim, causal, segments, window, BlockSizes fields)
    (128, False, False, None, dict(registers=240)), (128, True, True, None, {}),
    (64, True, False, None, dict(stages=3)), (256, True, True, None, dict(block_k=64, registers=240)),
    (128, True, False, 200, {}),
]


def interpret():
    for dtype, causal, where, seg, h, kvh, sq, sk, d, b in CASES:
        rng = np.random.default_rng(sq + sk + d)
        for fields in TILES:
            inputs = t._inputs(rng, sq=sq, sk=sk, heads=h, kv_heads=kvh, dim=d, dtype=dtype,
                               where=where, segments=seg, batch=b)
            t._check_forward(inputs, causal, ph.BlockSizes(fwd_overlap=True, **fields))
            print("ok", dtype, causal, where, seg, d, fields, flush=True)
    for window in (100, 300):
        rng = np.random.default_rng(window)
        inputs = t._inputs(rng, sq=200, sk=328, heads=2, kv_heads=1, dim=64, dtype="bfloat16",
                           where="overlap", segments=True, batch=1)
        for causal in (True, False):
            bs = ph.BlockSizes(fwd_overlap=True, block_k=64)
            t._check_forward(inputs, causal, bs, window=window)
            print("ok window", window, causal, flush=True)


def lower(semantics: str):
    jax.clear_caches()
    if semantics == "warpgroup":
        plgpu.CompilerParams = functools.partial(
            plgpu.CompilerParams, lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
    for d, causal, seg, window, fields in LOWER:
        q = jax.ShapeDtypeStruct((1, 384, 4, d), jnp.bfloat16)
        k = jax.ShapeDtypeStruct((1, 384, 2, d), jnp.bfloat16)
        pos = jax.ShapeDtypeStruct((384,), jnp.int32)
        ids = jax.ShapeDtypeStruct((1, 384), jnp.int32) if seg else None
        bs = ph.BlockSizes(fwd_overlap=True, **fields)

        def fwd(q, k, v, p, s, causal=causal, bs=bs, window=window):
            return ph.forward_step(q, k, v, p, p, s, s, causal=causal, softmax_scale=0.1,
                                   block_sizes=bs, window=window)

        text = jax.jit(fwd).trace(q, k, k, pos, ids).lower(lowering_platforms=("cuda",)).as_text()
        print("lowered", semantics, d, causal, seg, window,
              text.count("stablehlo.custom_call @mosaic_gpu"), flush=True)


if __name__ == "__main__":
    interpret()
    lower("default")
    lower("warpgroup")
