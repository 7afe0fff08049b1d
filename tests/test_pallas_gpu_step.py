"""The Pallas GPU (Triton) ring step, kernel-level, in interpret mode: one step's forward and
backward against the float32 step references (GQA, segment ids, ragged shards, padded head dims,
sliding windows, a step that sees nothing), the block-skipping bounds, and the block sizes' checks
and defaults. What the pallas_gpu tests share: pallas_gpu_cases.py.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from pallas_gpu_cases import BS, BS_MIXED, RTOL
from ringcheck import F32_RTOL, rel_err

from ringattention.kernels import common
from ringattention.kernels.triton import pallas_gpu as pg


def _step_inputs(rng, *, batch, sq, sk, heads, kv_heads, dim, dtype, causal_offset, segments, stride=None):
    f = lambda *s: jnp.asarray(rng.standard_normal(s), dtype)  # noqa: E731
    q, do = f(batch, sq, heads, dim), f(batch, sq, heads, dim)
    k, v = f(batch, sk, kv_heads, dim), f(batch, sk, kv_heads, dim)
    if stride is None:
        stride = int(rng.integers(1, 4))  # striped-like gaps between positions
    q_pos = jnp.asarray(np.arange(sq) * stride + causal_offset, jnp.int32)
    k_pos = jnp.asarray(np.arange(sk) * stride, jnp.int32)

    def seg(length):  # sorted ids: packed documents
        return jnp.asarray(np.sort(rng.integers(0, 3, (batch, length)), axis=1), jnp.int32)

    q_seg, k_seg = (seg(sq), seg(sk)) if segments else (None, None)
    return q, k, v, do, q_pos, k_pos, q_seg, k_seg


def _run_step(inputs, causal, block_sizes, window=None):
    q, k, v, do, q_pos, k_pos, q_seg, k_seg = inputs
    kw = dict(causal=causal, softmax_scale=q.shape[-1] ** -0.5, window=window)
    o, lse = pg.forward_step(
        q, k, v, q_pos, k_pos, q_seg, k_seg, block_sizes=block_sizes, interpret=True, **kw
    )
    ro, rlse = pg.reference_forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, **kw)
    delta = jnp.einsum("bshd,bshd->bhs", ro, do.astype(jnp.float32))
    grads = pg.backward_step(
        q, k, v, do, rlse, delta, q_pos, k_pos, q_seg, k_seg, block_sizes=block_sizes, interpret=True, **kw
    )
    rgrads = pg.reference_backward_step(q, k, v, do, rlse, delta, q_pos, k_pos, q_seg, k_seg, **kw)
    return (o, lse, *grads), (ro, rlse, *rgrads)


STEP_CASES = [  # (dtype, causal, segments, kv_heads, sq, sk, dim)
    ("float32", True, False, 2, 64, 48, 32),
    ("float32", True, True, 1, 40, 64, 16),  # q shard not a multiple of the block
    ("float32", False, True, 4, 32, 40, 24),  # k tail and head dim 24 padded to 32
    ("bfloat16", True, True, 2, 64, 64, 64),
    ("bfloat16", False, False, 1, 48, 32, 32),
]


def _check_step(case, window=None, offset=None, batch=2, heads=4):
    dtype, causal, segments, kv_heads, sq, sk, dim = case
    rng = np.random.default_rng(sq * sk + dim)
    if offset is None:  # query block may start before, inside or after the keys
        offset = int(rng.integers(0, 2 * sk))
    inputs = _step_inputs(
        rng,
        batch=batch,
        sq=sq,
        sk=sk,
        heads=heads,
        kv_heads=kv_heads,
        dim=dim,
        dtype=dtype,
        causal_offset=offset,
        segments=segments,
        stride=None if window is None else 1,
    )
    got, want = _run_step(inputs, causal, BS_MIXED, window)
    lse, rlse = np.asarray(got[1]), np.asarray(want[1])
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(rlse))
    finite = np.isfinite(rlse)
    assert rel_err(lse[finite], rlse[finite]) <= F32_RTOL
    names = ("o", "dq", "dk", "dv")
    for name, g, w in zip(names, got[:1] + got[2:], want[:1] + want[2:], strict=True):
        assert rel_err(g, w) <= RTOL[dtype], name


@pytest.mark.parametrize("case", STEP_CASES, ids=lambda c: "-".join(map(str, c)))
def test_step_matches_reference(case):
    _check_step(case)


# (case as above, window, query offset), consecutive positions. Forward rows (32 queries, keys in
# blocks of 16): hidden blocks, then partial ones at the window's far edge, then fully visible ones,
# then (second case) partial ones at the near edge of a symmetric window.
WINDOW_STEP_CASES = [
    (("float32", True, True, 2, 64, 96, 16), 80, 100),
    (("bfloat16", False, False, 1, 40, 128, 32), 40, 30),  # ragged query shard
]


@pytest.mark.parametrize(
    "case,window,offset",
    WINDOW_STEP_CASES,
    ids=lambda c: "-".join(map(str, c)) if isinstance(c, tuple) else str(c),
)
def test_step_with_window_matches_reference(case, window, offset):
    _check_step(case, window, offset, batch=1, heads=2)


def test_edge_bounds_cover_visible_blocks():
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.integers(0, 3, (2, 6, 9)), jnp.int32)
    lo, mid, hi, edge = (np.asarray(x) for x in common.edge_bounds(table, 2))
    table = np.asarray(table)
    j = np.arange(9)
    for b, i in np.ndindex(2, 6):
        assert lo[b, i] <= edge[b, i] <= mid[b, i] <= hi[b, i]
        live = j[table[b, i] != 0]
        assert np.all((live >= lo[b, i]) & (live < hi[b, i]))
        assert np.all(table[b, i, edge[b, i] : mid[b, i]] == 2)


def test_step_that_sees_nothing_is_zero_and_finite():
    # Every key comes after every query: all blocks are hidden and skipped.
    rng = np.random.default_rng(1)
    q, k, v, do, q_pos, k_pos, q_seg, k_seg = _step_inputs(
        rng,
        batch=1,
        sq=32,
        sk=32,
        heads=2,
        kv_heads=1,
        dim=16,
        dtype="float32",
        causal_offset=0,
        segments=True,
    )
    k_pos = k_pos + 1000
    got, _ = _run_step((q, k, v, do, q_pos, k_pos, q_seg, k_seg), True, BS)
    o, lse, dq, dk, dv = (np.asarray(x) for x in got)
    assert np.all(np.isneginf(lse))
    for x in (o, dq, dk, dv):
        assert np.all(x == 0.0)


def test_block_sizes_are_validated():
    with pytest.raises(ValueError, match="block_k"):
        pg.BlockSizes(block_k=48)
    with pytest.raises(ValueError, match="fwd_warps"):
        pg.BlockSizes(fwd_warps=0)
    assert pg.default_block_sizes(64) != pg.default_block_sizes(256)


def test_float32_defaults_fit_shared_memory():
    """float32 tiles are twice bf16's: at head dim 128 the backward keeps 2 stages (3 ask for 289 KB
    of shared memory; tests/test_gpu_aot.py compiles both for an H200); other fields unchanged."""
    wide, narrow = pg.default_block_sizes(128, jnp.float32), pg.default_block_sizes(128, jnp.bfloat16)
    assert wide == dataclasses.replace(narrow, bwd_stages=2) and narrow.bwd_stages == 3
    assert pg.default_block_sizes(64, jnp.float32) == pg.default_block_sizes(64)
