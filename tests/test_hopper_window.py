"""Sliding windows in the Pallas Mosaic GPU (Hopper) steps, run in Mosaic GPU's interpret mode on CPU
(what that checks and what only the device does: hopper_cases.py).

The forward and every backward (the two-kernel one, the fused one, the head-dim-split pair) against
the float32 step reference, each case placing the window so that the kernels meet blocks at the
window's edge (masked), fully visible blocks and diagonal blocks.
"""

import numpy as np
import pytest
from hopper_cases import _check_backward, _check_forward, _inputs, needs_interpret

from ringattention.kernels.hopper import pallas_hopper as ph


# Sliding windows: queries from 128 on, keys at 0..255 (128-row CTAs). Forward, non-causal, W = 200:
# one query CTA whose first key block is at the window's edge (masked) and the second fully visible;
# both sides of the window are compared. Backward, causal, W = 300, 256 queries: every kernel sees
# rows of window-edge (masked), fully visible and diagonal (masked) blocks, and the second key CTA
# rotates its two fully visible query blocks.
@needs_interpret
def test_forward_step_with_window():
    rng = np.random.default_rng(12)
    inputs = _inputs(
        rng,
        sq=128,
        sk=256,
        heads=2,
        kv_heads=1,
        dim=64,
        dtype="bfloat16",
        where="overlap",
        segments=True,
        batch=1,
    )
    _check_forward(inputs, False, window=200)


@needs_interpret
@pytest.mark.parametrize("backward", [pytest.param("mosaic", marks=pytest.mark.slow), "fused"])
def test_backward_step_with_window(backward):
    rng = np.random.default_rng(13)
    inputs = _inputs(
        rng,
        sq=256,
        sk=256,
        heads=2,
        kv_heads=1,
        dim=64,
        dtype="bfloat16",
        where="overlap",
        segments=False,
        batch=1,
    )
    _check_backward(inputs, True, ph.BlockSizes(backward=backward), window=300)


@pytest.mark.slow
@needs_interpret
@pytest.mark.parametrize("backward", ph.BACKWARDS)
def test_window_steps_both_ways(backward):
    """Causal forward and non-causal backward with segment ids and GQA under a window."""
    rng = np.random.default_rng(14)
    inputs = _inputs(
        rng,
        sq=256,
        sk=256,
        heads=4,
        kv_heads=2,
        dim=64,
        dtype="bfloat16",
        where="overlap",
        segments=True,
        batch=1,
    )
    _check_forward(inputs, True, window=300)
    _check_backward(inputs, False, ph.BlockSizes(backward=backward), window=200)


# Windows for the head-dim-split backwards (64-key CTAs, 64-query blocks) and the forward at head
# dim 256 (block_k=64): causal, W = 200, queries at 96..223, keys at 0..191. The dq kernel meets a
# window-edge (masked), a fully visible and diagonal blocks; key CTA 0 runs its edge block, then a
# fully visible one, key CTA 1 a fully visible one, then the diagonal. The fused backward (128-key
# CTAs): queries at 128..255, keys at 0..255, key CTA 0 starts at the window's edge, key CTA 1 runs
# two diagonal blocks.
@needs_interpret
def test_head_dim_256_split_backwards_with_window():
    rng = np.random.default_rng(15)
    inputs = _inputs(
        rng,
        sq=128,
        sk=192,
        heads=1,
        kv_heads=1,
        dim=256,
        dtype="bfloat16",
        where="overlap",
        segments=False,
        batch=1,
    )
    _check_forward(inputs, True, window=200)
    _check_backward(inputs, True, None, window=200)  # the default: the deterministic split pair


@needs_interpret
def test_cta_dq_backward_with_window():
    rng = np.random.default_rng(16)
    inputs = _inputs(
        rng,
        sq=128,
        sk=256,
        heads=2,
        kv_heads=1,
        dim=128,
        dtype="bfloat16",
        where="overlap",
        segments=False,
        batch=1,
    )
    _check_backward(inputs, True, ph.BlockSizes(backward="fused", registers=240), window=200)


WINDOW_SLOW_CASES = [  # (dim, BlockSizes): the head-dim-split pair, the fused backward
    (200, ph.BlockSizes(backward="mosaic", block_k=64, registers=240)),
    (128, ph.BlockSizes(backward="fused", bwd_stages=3)),
    (64, ph.BlockSizes(backward="fused")),
]


@pytest.mark.slow
@needs_interpret
@pytest.mark.parametrize("case", WINDOW_SLOW_CASES, ids=lambda c: f"{c[1].backward}-d{c[0]}")
def test_window_steps_both_ways_wide_heads(case):
    """As ``test_window_steps_both_ways`` for the backwards of wider heads: causal forward,
    non-causal backward, segment ids, GQA, a ragged query shard; key CTAs with two fully visible
    query blocks rotate them."""
    dim, bs = case
    rng = np.random.default_rng(dim)
    inputs = _inputs(
        rng,
        sq=200,
        sk=256,
        heads=4,
        kv_heads=2,
        dim=dim,
        dtype="bfloat16",
        where="overlap",
        segments=True,
        batch=1,
    )
    _check_forward(inputs, True, bs, window=300)
    _check_backward(inputs, False, bs, window=150)
