"""The Pallas Mosaic GPU (Hopper) forward step, run in Mosaic GPU's interpret mode on CPU (what that
checks and what only the device does: hopper_cases.py).

The forward against the float32 step reference (ragged, GQA, segment ids, padded head dims) under
the ping-pong and FA3's intra-warpgroup overlap (``BlockSizes(schedule="overlap")``); which schedule
the defaults pick per head dim and mask; float32, which runs the Triton step.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hopper_cases import _check_forward, _inputs, needs_interpret

from ringattention.kernels.hopper import pallas_hopper as ph

STEP_CASES = [  # (dtype, causal, where, segments, heads, kv_heads, sq, sk, dim, batch)
    ("bfloat16", True, "overlap", True, 2, 1, 72, 200, 64, 2),  # ragged, GQA, ids, one block
    ("bfloat16", True, "after", True, 2, 1, 72, 600, 64, 1),  # 3 blocks of 256 keys, 2 slots
    ("float16", False, "overlap", False, 2, 2, 128, 384, 128, 1),  # 3 key blocks through 2 slots
    ("bfloat16", True, "after", False, 2, 1, 64, 96, 40, 1),  # all blocks FULL; head dim 40 -> 64
]


@needs_interpret
@pytest.mark.parametrize("case", STEP_CASES, ids=lambda c: "-".join(map(str, c)))
def test_forward_step_matches_reference(case):
    dtype, causal, where, segments, heads, kv_heads, sq, sk, dim, batch = case
    rng = np.random.default_rng(sq + sk + dim)
    inputs = _inputs(
        rng,
        sq=sq,
        sk=sk,
        heads=heads,
        kv_heads=kv_heads,
        dim=dim,
        dtype=dtype,
        where=where,
        segments=segments,
        batch=batch,
    )
    _check_forward(inputs, causal)


@needs_interpret
def test_step_that_sees_nothing_is_zero():
    rng = np.random.default_rng(3)
    inputs = _inputs(
        rng,
        sq=64,
        sk=128,
        heads=2,
        kv_heads=1,
        dim=64,
        dtype="bfloat16",
        where="before",
        segments=False,
        batch=1,
    )
    _check_forward(inputs, causal=True)


# FA3's intra-warpgroup overlap (BlockSizes(schedule="overlap"), fwd_loops.overlap_loops):
# its first block runs before the loops and its last P.V after them, so the cases cover a query
# block that sees nothing (no loop at all), one key block (empty loops), two blocks with masks, ids
# and GQA, and a window's masked far edge before the fully visible blocks.
OVERLAP_CASES = [  # (dtype, causal, where, segments, kv_heads, sq, sk, dim, window)
    ("bfloat16", True, "before", False, 1, 64, 128, 64, None),
    ("float16", True, "after", True, 2, 64, 64, 128, None),
    ("bfloat16", True, "overlap", True, 1, 72, 200, 64, None),
    ("bfloat16", False, "overlap", True, 1, 128, 256, 64, 200),
]


@needs_interpret
@pytest.mark.parametrize("case", OVERLAP_CASES, ids=lambda c: "-".join(map(str, c)))
def test_forward_overlap_matches_reference(case):
    dtype, causal, where, segments, kv_heads, sq, sk, dim, window = case
    rng = np.random.default_rng(sq + sk + dim + 7)
    inputs = _inputs(
        rng,
        sq=sq,
        sk=sk,
        heads=2,
        kv_heads=kv_heads,
        dim=dim,
        dtype=dtype,
        where=where,
        segments=segments,
        batch=1,
    )
    _check_forward(inputs, causal, ph.BlockSizes(schedule="overlap"), window)


@needs_interpret
def test_default_forward_schedule_by_mask(forward_loops_used):
    """Head dims 64 and 128 run the ping-pong of three compute warpgroups over 128-key blocks (of
    two on shards under 192 rows), with a causal mask or without (the H100 A/B of 2026-12-08);
    without one head dim 64 keeps 232 registers (240 with one), and MLA runs FA3's overlap."""
    used = forward_loops_used
    for dim, causal, rows, want in (
        (128, False, 256, ("loops", True, 3)),
        (128, True, 256, ("loops", True, 3)),
        (128, True, 128, ("loops", True, 2)),
        (64, True, 256, ("loops", True, 3)),
        (64, False, 256, ("loops", True, 3)),
    ):
        q = jax.ShapeDtypeStruct((1, rows, 2, dim), jnp.bfloat16)
        pos = jax.ShapeDtypeStruct((rows,), jnp.int32)
        used.clear()
        jax.eval_shape(
            functools.partial(ph.forward_step, causal=causal, softmax_scale=0.1, interpret=True),
            q,
            q,
            q,
            pos,
            pos,
            None,
            None,
        )
        assert set(used) == {want}, (dim, causal, used)
    assert ph.default_block_sizes(128, causal=False) == ph.default_block_sizes(128)
    assert ph.default_block_sizes(64, causal=False) == dataclasses.replace(
        ph.default_block_sizes(64), registers=232
    )
    for d in (64, 128):
        assert (ph.default_block_sizes(d).schedule, ph.default_block_sizes(d).block_k) == ("pingpong3", 128)
    assert ph.default_block_sizes(192, causal=False, v_head_dim=128).schedule == "overlap"
    assert ph.deterministic_block_sizes(None, 128, causal=False).schedule == "pingpong3"
    assert ph.deterministic_block_sizes(None, 128).schedule == "pingpong3"


SLOW_CASES = [  # (dtype, causal, where, segments, kv_heads, dim, stride, BlockSizes)
    ("bfloat16", True, "overlap", True, 4, 128, 1, ph.BlockSizes(block_k=64, stages=3)),
    ("float16", True, "before", True, 2, 64, 1, ph.BlockSizes(schedule="overlap")),
    ("bfloat16", True, "overlap", False, 2, 80, 4, None),  # striped positions, padded head dim
    ("bfloat16", False, "after", True, 1, 64, 1, ph.BlockSizes(block_k=64, stages=2)),
    (
        "bfloat16",
        True,
        "overlap",
        True,
        2,
        128,
        1,  # 6 key blocks through 3 slots, overlapped
        ph.BlockSizes(block_k=64, stages=3, schedule="overlap"),
    ),
]


@pytest.mark.slow
@needs_interpret
@pytest.mark.parametrize("case", SLOW_CASES, ids=lambda c: "-".join(map(str, c[:7])))
def test_forward_step_matrix(case):
    dtype, causal, where, segments, kv_heads, dim, stride, bs = case
    rng = np.random.default_rng(dim + stride)
    inputs = _inputs(
        rng,
        sq=200,
        sk=328,
        heads=4,
        kv_heads=kv_heads,
        dim=dim,
        dtype=dtype,
        where=where,
        segments=segments,
        stride=stride,
    )
    _check_forward(inputs, causal, bs)


def test_float32_forward_is_the_triton_step():
    rng = np.random.default_rng(11)
    inputs = _inputs(
        rng, sq=32, sk=48, heads=2, kv_heads=1, dim=16, dtype="float32", where="overlap", segments=True
    )
    _check_forward(inputs, causal=True)
