"""The Pallas Mosaic GPU (Hopper) ring step, run in Mosaic GPU's interpret mode on CPU.

Interpret mode executes the real kernel structure (three warpgroups, TMA copies, barriers, the slot
ring, masks from global positions and segment ids); only wgmma and register layouts are replaced by
plain ``jnp`` (``mosaic.Ops``), so those are checked on the device only
(``tools/hopper_check.py``). The interpreter simulates a single GPU, so ring runs here use one
device; ring steps with other offsets are covered at the kernel level (query block after, overlapping
and before the key block). All backwards are checked: the two-kernel Mosaic GPU one (what
``deterministic=True`` runs), the fused Mosaic GPU one (``BlockSizes(backward="fused")``, the
default at head dims 64 and 128; its TMA reduce-add of dq becomes a read-modify-write in
interpret mode, see ``fused_bwd``; above head dim 128 "mosaic" is the head-dim-split
pair, ``split_bwd``) and the Triton step's kernels
(``BlockSizes(backward="triton")``). ``test_kernels_lower_for_cuda`` also lowers every Mosaic GPU
kernel for CUDA (wgmma, layouts, TMA, ``setmaxnreg``), which needs no GPU, so lowering errors show
up here rather than on the device.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu
from ringcheck import BF16_RTOL, F32_RTOL, Problem, check_ring, rel_err

from ringattention import implementations
from ringattention.kernels.hopper import backward as hb
from ringattention.kernels.hopper import cta_dq_bwd as hcb
from ringattention.kernels.hopper import fused_bwd as hfb
from ringattention.kernels.hopper import pallas_hopper as ph
from ringattention.kernels.hopper import split_bwd as hsb
from ringattention.kernels.triton import pallas_gpu as pg

needs_interpret = pytest.mark.skipif(
    ph.interpret_params() is None,
    reason="this jax has no Mosaic GPU interpret mode; pallas_hopper is checked on the device by "
    "tools/hopper_check.py",
)
RTOL = {"float32": F32_RTOL, "bfloat16": BF16_RTOL, "float16": BF16_RTOL}
LSE_ATOL = 1e-4  # natural-log units: lse is computed in float32 from exact half-precision products


def _inputs(rng, *, sq, sk, heads, kv_heads, dim, dtype, where, segments, stride=1, batch=2):
    f = lambda *s: jnp.asarray(rng.standard_normal(s), dtype)  # noqa: E731
    q, do = f(batch, sq, heads, dim), f(batch, sq, heads, dim)
    k, v = f(batch, sk, kv_heads, dim), f(batch, sk, kv_heads, dim)
    offset = {"after": sk * stride, "overlap": sk * stride // 2, "before": -sq * stride}[where]
    q_pos = jnp.asarray(np.arange(sq) * stride + offset, jnp.int32)
    k_pos = jnp.asarray(np.arange(sk) * stride, jnp.int32)
    seg = lambda n: jnp.asarray(np.sort(rng.integers(0, 3, (batch, n)), axis=1), jnp.int32)  # noqa: E731
    q_seg, k_seg = (seg(sq), seg(sk)) if segments else (None, None)
    return q, k, v, do, q_pos, k_pos, q_seg, k_seg


def _check_forward(inputs, causal, block_sizes=None, window=None):
    q, k, v, _, q_pos, k_pos, q_seg, k_seg = inputs
    kw = dict(causal=causal, softmax_scale=q.shape[-1] ** -0.5, window=window)
    o, lse = ph.forward_step(
        q, k, v, q_pos, k_pos, q_seg, k_seg, block_sizes=block_sizes, interpret=True, **kw
    )
    ro, rlse = pg.reference_forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, **kw)
    assert o.dtype == lse.dtype == jnp.float32
    assert o.shape == q.shape and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    lse, rlse = np.asarray(lse), np.asarray(rlse)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(rlse))
    finite = np.isfinite(rlse)
    if finite.any():
        assert np.abs(lse[finite] - rlse[finite]).max() <= LSE_ATOL
        assert rel_err(o, ro) <= RTOL[jnp.dtype(q.dtype).name]
    else:  # nothing visible: exactly zero
        assert np.all(np.asarray(o) == 0.0)
    return ro, rlse


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
    """Head dim 128 without a causal mask runs the overlapped forward without the ping-pong (the
    H200 default); with one the ping-pong of three compute warpgroups (of two on shards under 192
    rows), and at head dim 64 the same with a causal mask, the ping-pong of two without one."""
    used = forward_loops_used
    for dim, causal, rows, want in (
        (128, False, 256, ("overlap_loops", False, 2)),
        (128, True, 256, ("loops", True, 3)),
        (128, True, 128, ("loops", True, 2)),
        (64, True, 256, ("loops", True, 3)),
        (64, False, 256, ("loops", True, 2)),
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
    bs = ph.default_block_sizes(128, causal=False)
    assert bs.schedule == "overlap" and ph.default_block_sizes(128).schedule == "pingpong3"
    assert bs == dataclasses.replace(ph.default_block_sizes(128), schedule="overlap")
    # head dim 64: three warpgroups over 128-key blocks with a causal mask, two over 256 without
    assert ph.default_block_sizes(64, causal=False) == dataclasses.replace(
        ph.default_block_sizes(64), registers=232, block_k=256, schedule="pingpong"
    )
    assert (ph.default_block_sizes(64).schedule, ph.default_block_sizes(64).block_k) == ("pingpong3", 128)
    assert ph.deterministic_block_sizes(None, 128, causal=False).schedule == "overlap"
    assert ph.deterministic_block_sizes(None, 128).schedule == "pingpong3"


def _check_backward(inputs, causal, block_sizes, window=None):
    q, k, v, do, q_pos, k_pos, q_seg, k_seg = inputs
    kw = dict(causal=causal, softmax_scale=q.shape[-1] ** -0.5, window=window)
    ro, rlse = pg.reference_forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, **kw)
    delta = jnp.einsum("bshd,bshd->bhs", ro, do.astype(jnp.float32))
    got = ph.backward_step(
        q, k, v, do, rlse, delta, q_pos, k_pos, q_seg, k_seg, block_sizes=block_sizes, interpret=True, **kw
    )
    want = pg.reference_backward_step(q, k, v, do, rlse, delta, q_pos, k_pos, q_seg, k_seg, **kw)
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert g.dtype == jnp.float32 and g.shape == w.shape, name
        if np.any(np.asarray(w)):
            assert rel_err(g, w) <= RTOL[jnp.dtype(q.dtype).name], name
        else:  # nothing visible: exactly zero
            assert np.all(np.asarray(g) == 0.0), name
    return got


@needs_interpret
@pytest.mark.parametrize("backward", ph.BACKWARDS)
def test_backward_step_matches_reference(backward):
    rng = np.random.default_rng(5)
    inputs = _inputs(
        rng, sq=72, sk=80, heads=2, kv_heads=1, dim=64, dtype="bfloat16", where="overlap", segments=True
    )
    _check_backward(inputs, True, ph.BlockSizes(backward=backward))


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


@needs_interpret
def test_alternating_dq_with_an_odd_number_of_pairs():
    """Head dim 64, the fused backward: three query heads per kv head and one query block, so a key
    CTA has three pairs (or fewer where causal hides some): the last parity's barrier phase is
    observed at the end and the first warpgroup adds two of the three dq tiles."""
    rng = np.random.default_rng(17)
    inputs = _inputs(
        rng,
        sq=64,
        sk=200,
        heads=3,
        kv_heads=1,
        dim=64,
        dtype="bfloat16",
        where="overlap",
        segments=False,
        batch=1,
    )
    _check_backward(inputs, True, ph.BlockSizes(backward="fused"))


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


@needs_interpret
@pytest.mark.parametrize("backward", [pytest.param("mosaic", marks=pytest.mark.slow), "fused"])
def test_key_ctas_rotate_their_query_blocks(backward):
    """Three key CTAs over four fully visible query blocks: each CTA starts at a different block
    (``bwd_common.visit``) and the dq contributions still land on the right rows."""
    rng = np.random.default_rng(8)
    inputs = _inputs(
        rng,
        sq=256,
        sk=384,
        heads=2,
        kv_heads=2,
        dim=64,
        dtype="bfloat16",
        where="after",
        segments=False,
        batch=1,
    )
    _check_backward(inputs, False, ph.BlockSizes(backward=backward))


@needs_interpret
def test_mosaic_backward_with_128_key_blocks():
    """The dq kernel streaming 128 keys per block (``bwd_block_k=128``), as deterministic=True runs
    it at head dim 64 (2 stages, 232 registers): three key blocks, ragged, causal, segment ids."""
    rng = np.random.default_rng(6)
    inputs = _inputs(
        rng,
        sq=72,
        sk=300,
        heads=2,
        kv_heads=1,
        dim=64,
        dtype="bfloat16",
        where="overlap",
        segments=True,
        batch=1,
    )
    bs = ph.deterministic_block_sizes(None, 64)
    assert (bs.backward, bs.bwd_block_k, bs.bwd_stages, bs.registers) == ("mosaic", 128, 2, 232)
    _check_backward(inputs, True, bs)


def _head_dim_256_inputs():
    rng = np.random.default_rng(12)
    return _inputs(
        rng,
        sq=72,
        sk=130,
        heads=2,
        kv_heads=1,
        dim=256,
        dtype="bfloat16",
        where="overlap",
        segments=True,
        batch=1,
    )


@needs_interpret
def test_head_dim_256_forward_and_split_backward():
    """Head dim 256 with its defaults: the forward, then the deterministic dq + dk/dv kernels whose
    warpgroups split the head dim (``split_bwd``, "mosaic"); causal, GQA, segment ids,
    ragged shards, two key and two query CTAs."""
    inputs = _head_dim_256_inputs()
    _check_forward(inputs, True)
    assert ph.default_block_sizes(256).backward == "mosaic"
    _check_backward(inputs, True, None)


@needs_interpret
@pytest.mark.parametrize("dim", [128, 64])
def test_fused_backward_with_one_dq_tile_per_cta(dim):
    """The fused backward (``cta_dq_bwd``): the two warpgroups of a key CTA add one dq tile,
    half its columns each (128) or taking turns by pair parity (64: four pairs per key CTA, so
    both parities' buffers are reused); causal, GQA, segment ids, ragged, two key CTAs."""
    rng = np.random.default_rng(13)
    inputs = _inputs(
        rng,
        sq=72,
        sk=200,
        heads=2,
        kv_heads=1,
        dim=dim,
        dtype="bfloat16",
        where="overlap",
        segments=True,
        batch=1,
    )
    _check_backward(inputs, True, ph.BlockSizes(backward="fused", registers=240))


@needs_interpret
@pytest.mark.parametrize(
    "backward",
    [
        "default",
        pytest.param("mosaic", marks=pytest.mark.slow),
        pytest.param("fused", marks=pytest.mark.slow),
    ],
)
def test_ring_on_one_device(backward):
    """The float64 global reference through ring_attention: the default backward at head dim 32
    (one dq tile per CTA, the alternating kernel), and (slow) the two-kernel one and the fused one
    with the dataclass's tiles."""
    bs = None if backward == "default" else ph.BlockSizes(backward=backward)
    check_ring(
        Problem(
            n=1,
            layout="zigzag",
            causal=True,
            segments=True,
            batch=1,
            shard=96,
            heads=4,
            kv_heads=2,
            head_dim=32,
            dtype="bfloat16",
        ),
        implementation="pallas_hopper",
        interpret=True,
        block_sizes=bs,
    )


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


@needs_interpret
@pytest.mark.parametrize("dim,backward", [(64, None), (128, None), (128, "mosaic")])
def test_unmasked_gqa_backward(dim, backward):
    """No mask at all (non-causal, no ids, no window) with two query heads per kv head: the key
    CTAs run one flat loop over the group's (head, block) pairs (``hbk.group_loop``), the dq kernel
    one loop over its blocks (``hbc.block_loops``). Default backward (the alternating / one dq tile
    per CTA kernels) and the two-kernel one; two key CTAs, a ragged query shard (2 blocks)."""
    rng = np.random.default_rng(11 + dim)
    inputs = _inputs(
        rng,
        sq=72,
        sk=136,
        heads=4,
        kv_heads=2,
        dim=dim,
        dtype="bfloat16",
        where="overlap",
        segments=False,
        batch=1,
    )
    bs = None if backward is None else ph.BlockSizes(backward=backward)
    _check_backward(inputs, False, bs)


SPLIT_GROUP_RTOL = 1e-5  # dk, dv summed over the group in another order: float32 rounding only


@needs_interpret
@pytest.mark.parametrize("dim,causal", [(64, False), pytest.param(128, True, marks=pytest.mark.slow)])
def test_split_group_backward(dim, causal, monkeypatch):
    """``BlockSizes(split_group=...)``: one key CTA per query head (k, v repeated over the group,
    dk, dv summed over it afterwards) against the reference, and against the group loop of the same
    kernel: the same products, only dk/dv's sum over the group in another order. No mask (the
    alternating dq kernel at 64) and causal with ids (the column split at 128); two query
    heads on one kv head, two key CTAs, a ragged query shard. At 64 the split run is the default's
    rule (None) with its dq threshold lowered to these shapes: the rule is what the backward asks."""
    rng = np.random.default_rng(17 + dim)
    q, k, v, do, q_pos, k_pos, q_seg, k_seg = _inputs(
        rng,
        sq=72,
        sk=136,
        heads=2,
        kv_heads=1,
        dim=dim,
        dtype="bfloat16",
        where="overlap",
        segments=causal,
        batch=1,
    )
    kw = dict(causal=causal, softmax_scale=dim**-0.5)
    ro, rlse = pg.reference_forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, **kw)
    delta = jnp.einsum("bshd,bshd->bhs", ro, do.astype(jnp.float32))
    args = (q, k, v, do, rlse, delta, q_pos, k_pos, q_seg, k_seg)
    want = pg.reference_backward_step(*args, **kw)
    bs = ph.default_block_sizes(dim, causal)
    asked = []
    rule = hfb.use_split_group
    monkeypatch.setattr(hfb, "SPLIT_MIN_GROUP_DQ_BYTES", 0)
    monkeypatch.setattr(hfb, "use_split_group", lambda *a: asked.append(rule(*a)) or asked[-1])
    auto = None if not (causal and dim > 64) else True  # the rule keeps the loop causal at 128
    split, loop = (
        ph.backward_step(*args, block_sizes=dataclasses.replace(bs, split_group=s), interpret=True, **kw)
        for s in (auto, False)
    )
    assert asked == [True, False]
    for name, a, b, w in zip(("dq", "dk", "dv"), split, loop, want, strict=True):
        assert a.dtype == jnp.float32 and a.shape == b.shape == w.shape, name
        assert rel_err(a, w) <= RTOL["bfloat16"], name
        assert rel_err(a, b) <= SPLIT_GROUP_RTOL, name


@pytest.mark.parametrize(
    "shape,seq,causal,want",
    [
        # (heads, kv_heads, head_dim), tokens, causal: what the 2026-12-02 A/B measured faster
        # (docs/kernels.md)
        ((32, 8, 64), 32768, False, True),
        ((32, 8, 64), 131072, False, True),
        ((32, 8, 64), 16384, False, False),  # the group's dq (16 MiB) fits the L2: 1.00 vs 0.98x
        ((32, 8, 64), 65536, True, True),
        ((32, 8, 128), 65536, False, True),
        ((32, 8, 128), 65536, True, False),  # causal at head dim 128 lost (0.97 vs 0.96x)
        ((32, 32, 64), 131072, False, False),  # no group to split
        ((32, 8, 64), 1 << 20, True, False),  # 18 GiB more memory: over SPLIT_MAX_EXTRA_BYTES
    ],
)
def test_use_split_group_rule(shape, seq, causal, want):
    """``BlockSizes(split_group=None)`` decides from the shapes; a bool overrides it (with GQA)."""
    h, kvh, d = shape
    args = ((1, seq, h, d), (1, seq, kvh, d), d, causal, 2)
    assert hfb.use_split_group(None, *args) is want
    assert hfb.use_split_group(True, *args) is (h != kvh)
    assert hfb.use_split_group(False, *args) is False
    if h != kvh and seq == 1 << 20:
        assert hfb.split_group_extra_bytes(1, seq, h, kvh, d, 2) == 18 * 2**30


BWD_SLOW_CASES = [  # (dtype, causal, where, segments, heads, kv_heads, sq, sk, dim)
    ("float16", True, "overlap", False, 4, 2, 200, 328, 128),  # GQA group loop, ragged shards
    ("bfloat16", False, "overlap", True, 2, 2, 136, 72, 40),
    ("bfloat16", True, "before", True, 2, 1, 64, 128, 64),  # all hidden: exact zeros
    ("bfloat16", True, "after", False, 4, 1, 128, 256, 64),  # all blocks FULL, 4 heads per kv head
]


@pytest.mark.slow
@needs_interpret
@pytest.mark.parametrize("case", BWD_SLOW_CASES, ids=lambda c: "-".join(map(str, c)))
def test_mosaic_backward_matrix(case):
    dtype, causal, where, segments, heads, kv_heads, sq, sk, dim = case
    rng = np.random.default_rng(sq * sk + dim)
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
    )
    _check_backward(inputs, causal, ph.BlockSizes(backward="mosaic", bwd_stages=3))


SPLIT_SLOW_CASES = [  # (dtype, causal, where, segments, heads, kv_heads, sq, sk, dim)
    ("float16", False, "after", False, 2, 2, 64, 128, 200),  # MHA, head dim 200 padded to 256
    ("bfloat16", True, "before", True, 2, 1, 64, 128, 256),  # all hidden: exact zeros
    ("bfloat16", False, "after", False, 4, 1, 256, 192, 256),  # 4 heads per kv head, 3 rotated CTAs
    ("bfloat16", True, "overlap", False, 2, 1, 200, 136, 256),  # ragged, causal diagonal blocks
]


@pytest.mark.slow
@needs_interpret
@pytest.mark.parametrize("case", SPLIT_SLOW_CASES, ids=lambda c: "-".join(map(str, c)))
def test_split_backward_matrix(case):
    """The head-dim-split pair (head dims 129-256) over GQA groups, masks and shards."""
    dtype, causal, where, segments, heads, kv_heads, sq, sk, dim = case
    rng = np.random.default_rng(sq * sk + dim)
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
        batch=1,
    )
    _check_backward(inputs, causal, ph.BlockSizes(backward="mosaic", registers=240))


@pytest.mark.slow
@needs_interpret
@pytest.mark.parametrize("case", BWD_SLOW_CASES[:2] + BWD_SLOW_CASES[3:], ids=lambda c: "-".join(map(str, c)))
def test_cta_dq_backward_matrix(case):
    """The fused backward over the two-kernel one's matrix (head dims padded to 128: 40 runs at 80),
    with three stages."""
    dtype, causal, where, segments, heads, kv_heads, sq, sk, dim = case
    rng = np.random.default_rng(sq * sk + dim)
    inputs = _inputs(
        rng,
        sq=sq,
        sk=sk,
        heads=heads,
        kv_heads=kv_heads,
        dim=max(dim, 80),
        dtype=dtype,
        where=where,
        segments=segments,
    )
    _check_backward(inputs, causal, ph.BlockSizes(backward="fused", bwd_stages=3))


@pytest.mark.slow
@needs_interpret
def test_ring_on_one_device_head_dim_256():
    check_ring(
        Problem(
            n=1,
            layout="zigzag",
            causal=True,
            segments=True,
            batch=1,
            shard=96,
            heads=2,
            kv_heads=1,
            head_dim=256,
            dtype="bfloat16",
        ),
        implementation="pallas_hopper",
        interpret=True,
    )


@pytest.mark.slow
@needs_interpret
@pytest.mark.parametrize(
    "dim, bs",
    [(256, None), (128, ph.BlockSizes(backward="fused")), (64, ph.BlockSizes(backward="fused"))],
    ids=["split", "cta", "cta64"],
)
def test_ring_on_one_device_with_window_wide_heads(dim, bs):
    """The float64 global reference through ring_attention(sliding_window=...) for the backwards
    of wider heads (the head-dim-split default at 256, the fused backward at 128 and 64)."""
    check_ring(
        Problem(
            n=1,
            layout="zigzag",
            causal=True,
            segments=True,
            batch=1,
            shard=192,
            heads=2,
            kv_heads=1,
            head_dim=dim,
            dtype="bfloat16",
            window=100,
        ),
        implementation="pallas_hopper",
        interpret=True,
        block_sizes=bs,
    )


# ---- pure-JAX parts: always run ----------------------------------------------------------------


LOWER_CASES = [  # (backward, head dim, causal, segments, kv_heads, extra BlockSizes fields[, window])
    ("mosaic", 64, True, True, 2, dict(bwd_block_k=128, registers=232)),  # deterministic=True's at 64
    ("mosaic", 128, False, False, 4, dict(bwd_block_k=128, registers=240)),
    ("fused", 128, True, False, 2, dict(registers=240)),  # cta_dq_bwd
    ("fused", 80, False, True, 4, {}),
    ("mosaic", 256, True, True, 2, dict(block_k=64, registers=240)),  # split_bwd
    ("mosaic", 256, False, True, 1, dict(block_k=64, registers=240)),  # its dq + dk/dv kernels
    ("mosaic", 192, False, False, 4, dict(block_k=64)),  # padded to 256 in the backward
    ("fused", 128, True, True, 2, dict(bwd_stages=3)),
    ("mosaic", 64, False, True, 2, {}, 100),
    ("fused", 128, True, False, 2, dict(registers=240), 200),
    ("mosaic", 256, True, True, 2, dict(block_k=64, registers=240), 200),
    ("mosaic", 256, False, False, 1, dict(block_k=64, registers=240), 100),
    ("fused", 128, False, True, 2, dict(bwd_stages=3), 150),
    ("fused", 64, True, True, 2, {}),  # cta_dq_bwd.alternating_kernel
    ("fused", 40, False, False, 4, dict(bwd_stages=4), 100),
    ("fused", 128, False, False, 2, {}),  # no mask, GQA: the flat group loop
    ("fused", 64, False, False, 1, {}),
    ("mosaic", 256, False, False, 2, dict(block_k=64, registers=240)),  # the default at 256
    ("fused", 128, False, False, 2, dict(registers=240, schedule="overlap")),  # the
    # default at 128 without a mask
    ("fused", 64, True, True, 2, dict(schedule="overlap"), 100),  # overlap at head dim 64, window
    (
        "fused",
        64,
        True,
        True,
        2,
        dict(block_k=128, schedule="pingpong3", bwd_stages=3, registers=240),
    ),  # the default at 64 with a causal mask
    ("fused", 64, False, False, 2, dict(block_k=256, bwd_stages=3), 100),
    ("fused", 128, False, False, 2, dict(split_group=True)),  # a CTA per query head
]


@pytest.mark.parametrize("semantics", ["default", "warpgroup"])
@pytest.mark.parametrize(
    "case", LOWER_CASES, ids=lambda c: f"{c[0]}-d{c[1]}-{c[2]}-{c[3]}" + "".join(f"-w{w}" for w in c[6:])
)
def test_kernels_lower_for_cuda(case, semantics, monkeypatch):
    """Every Mosaic GPU kernel goes through Mosaic GPU's lowering for CUDA (no GPU needed): one
    custom call for the forward, two for the two-kernel backward, one for the fused one. Under
    both lowering semantics: jax 0.10 defaults to lane semantics, jax >= 0.11 (the GPU machine's)
    to warpgroup semantics, which rejects some kernels that lane semantics accepts."""
    jax.clear_caches()  # the kernels' jitted wrappers would reuse the other semantics' lowering
    if semantics == "warpgroup":
        monkeypatch.setattr(
            plgpu,
            "CompilerParams",
            functools.partial(plgpu.CompilerParams, lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        )
    backward, dim, causal, segments, kv_heads, fields, *window = case
    bs = ph.BlockSizes(backward=backward, **fields)
    q = jax.ShapeDtypeStruct((1, 384, 4, dim), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((1, 384, kv_heads, dim), jnp.bfloat16)
    pos = jax.ShapeDtypeStruct((384,), jnp.int32)
    seg = jax.ShapeDtypeStruct((1, 384), jnp.int32) if segments else None
    lse = jax.ShapeDtypeStruct((1, 4, 384), jnp.float32)
    kw = dict(causal=causal, softmax_scale=dim**-0.5, block_sizes=bs)
    if window:
        kw["window"] = window[0]

    def fwd(q, k, v, p, s):
        return ph.forward_step(q, k, v, p, p, s, s, **kw)

    def bwd(q, k, v, do, lse, delta, p, s):
        return ph.backward_step(q, k, v, do, lse, delta, p, p, s, s, **kw)

    def mosaic_calls(fn, *args):
        text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        return text.count("stablehlo.custom_call @mosaic_gpu")

    assert mosaic_calls(fwd, q, k, k, pos, seg) == 1
    assert mosaic_calls(bwd, q, k, k, q, lse, lse, pos, seg) == (2 if backward == "mosaic" else 1)


def _float_transposes(fn, *args) -> list[str]:
    """The float32/bf16 transposes of ``fn`` lowered for CUDA (the int32 block table of the key
    CTAs is transposed too, [B, nq, nk] -> [B, nk, nq], and is not counted)."""
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "stablehlo.custom_call @mosaic_gpu" in text
    return [
        line
        for line in text.splitlines()
        if "stablehlo.transpose" in line and ("xf32>" in line or "xbf16>" in line)
    ]


def _step_shapes(dim: int):
    """q, k (also v), positions and lse of a 512-token step with 4:2 heads, as ShapeDtypeStructs."""
    return (
        jax.ShapeDtypeStruct((1, 512, 4, dim), jnp.bfloat16),
        jax.ShapeDtypeStruct((1, 512, 2, dim), jnp.bfloat16),
        jax.ShapeDtypeStruct((512,), jnp.int32),
        jax.ShapeDtypeStruct((1, 4, 512), jnp.float32),
    )


@pytest.mark.parametrize(
    "dim,causal,deterministic",
    [(128, True, False), (128, False, False), (64, True, False), (128, True, True)],
)
def test_steps_write_their_outputs_in_place(dim, causal, deterministic):
    """The Mosaic kernels write o and dq in the step's [B, S, heads, D] layout, and the deterministic
    backward and head dim 64's default dk and dv too, so those steps, lowered for CUDA, hold no
    transpose: on an H200 the transposes took about 0.5 ms of a 15 ms step at 16K tokens (2026-12-03,
    docs/kernels.md). At head dim 128 the default backward's
    kernel writes dk, dv head-major and holds exactly their two transposes, [B, K, Sk, D] ->
    [B, Sk, K, D]: the step's layout ran 0.9-6% slower at 128K tokens (docs/kernels.md;
    ``fused_bwd.dkv_head_major``)."""
    bs = (
        ph.deterministic_block_sizes(None, dim, causal)
        if deterministic
        else ph.default_block_sizes(dim, causal)
    )
    q, k, pos, lse = _step_shapes(dim)
    kw = dict(causal=causal, softmax_scale=dim**-0.5, block_sizes=bs)

    def fwd(q, k, v, p):
        return ph.forward_step(q, k, v, p, p, None, None, **kw)

    def bwd(q, k, v, do, lse, delta, p):
        return ph.backward_step(q, k, v, do, lse, delta, p, p, None, None, **kw)

    assert _float_transposes(fwd, q, k, k, pos) == []
    transposes = _float_transposes(bwd, q, k, k, q, lse, lse, pos)
    if deterministic or dim == 64:
        assert transposes == []
    else:  # dk and dv, [1, 2, 512, D] -> [1, 512, 2, D]
        assert len(transposes) == 2, transposes
        assert all(f"tensor<1x2x512x{dim}xf32>) -> tensor<1x512x2x{dim}xf32>" in t for t in transposes), (
            transposes
        )


def test_float32_forward_is_the_triton_step():
    rng = np.random.default_rng(11)
    inputs = _inputs(
        rng, sq=32, sk=48, heads=2, kv_heads=1, dim=16, dtype="float32", where="overlap", segments=True
    )
    _check_forward(inputs, causal=True)


def test_geometry_pads_to_cta_and_key_blocks():
    bs = ph.BlockSizes(block_k=128)
    geo = ph.geometry(200, 300, 80, bs)
    assert (geo.cta_rows, geo.sq_pad, geo.bk, geo.sk_pad, geo.d_pad) == (128, 256, 128, 384, 128)
    short = ph.geometry(40, 70, 64, bs)  # a short shard takes one key block of its padded length
    assert (short.sq_pad, short.bk, short.sk_pad, short.d_pad) == (128, 128, 128, 64)
    assert ph.geometry(40, 50, 64, bs).bk == 64


def test_geometry_of_three_warpgroups():
    """``schedule="pingpong3"``: 192-row CTAs over a shard padded to 64 rows only (the last CTA
    overlaps the one before it), or two warpgroups where the shard is shorter than 192 rows."""
    bs = ph.BlockSizes(schedule="pingpong3")
    geo = ph.geometry(32768, 32768, 128, bs)
    assert (geo.wgs, geo.cta_rows, geo.sq_pad, geo.nq) == (3, 192, 32768, 171)
    geo = ph.geometry(200, 300, 128, bs)
    assert (geo.wgs, geo.sq_pad, geo.nq) == (3, 256, 2)
    assert (ph.geometry(130, 300, 128, bs).wgs, ph.geometry(130, 300, 128, bs).sq_pad) == (3, 192)
    assert (ph.geometry(100, 300, 128, bs).wgs, ph.geometry(100, 300, 128, bs).sq_pad) == (2, 128)
    q_pos = jnp.arange(256, dtype=jnp.int32)
    rows, _ = ph._cta_queries(geo, q_pos, None)  # the second CTA holds rows 64..255
    np.testing.assert_array_equal(np.asarray(rows), np.r_[0:192, 64:256])


def test_padding_hides_padded_keys_and_queries():
    geo = ph.geometry(70, 90, 64, ph.BlockSizes())
    x = jnp.ones((1, 70, 2, 64), jnp.bfloat16)
    kx = jnp.ones((1, 90, 1, 64), jnp.bfloat16)
    pos_q, pos_k = jnp.arange(70, dtype=jnp.int32), jnp.arange(90, dtype=jnp.int32)
    q, k, v, q_pos, k_pos, q_seg, k_seg = ph._pad(geo, x, kx, kx, pos_q, pos_k, None, None)
    assert q.shape == (1, geo.sq_pad, 2, 64) and k.shape == (1, geo.sk_pad, 1, 64)
    assert np.all(np.diff(np.asarray(q_pos)) >= 0) and np.all(np.diff(np.asarray(k_pos)) >= 0)
    vis = np.asarray(q_seg)[0, :, None] == np.asarray(k_seg)[0, None, :]  # [Sq_pad, Sk_pad]
    assert not vis[:, 90:].any() and not vis[70:, :].any() and vis[:70, :90].all()


def test_block_sizes_are_validated():
    with pytest.raises(ValueError, match="block_k"):
        ph.BlockSizes(block_k=96)
    with pytest.raises(ValueError, match="stages"):
        ph.BlockSizes(stages=1)
    with pytest.raises(ValueError, match="bwd_stages"):
        ph.BlockSizes(bwd_stages=0)
    with pytest.raises(ValueError, match="bwd_block_k"):
        ph.BlockSizes(bwd_block_k=96)
    with pytest.raises(ValueError, match="backward"):
        ph.BlockSizes(backward="cuda")
    with pytest.raises(TypeError, match="triton"):
        ph.BlockSizes(triton=ph.BlockSizes())
    with pytest.raises(ValueError, match="schedule"):
        ph.BlockSizes(schedule="ping-pong")
    with pytest.raises(ValueError, match="registers"):
        ph.BlockSizes(registers=224)
    with pytest.raises(TypeError, match="split_group"):
        ph.BlockSizes(split_group="true")
    assert ph.default_block_sizes(64) != ph.default_block_sizes(128)
    assert all(
        ph.default_block_sizes(d, c).split_group is None for d in (64, 128, 256) for c in (True, False)
    )  # decided per call from the shapes


def test_default_backward_by_head_dim(backward_used):
    """The default backward, checked by the kernel each head dim's default calls: fused with one
    dq tile per CTA up to 128 (the alternating kernel at 64 and below, the column split at
    65-128: ``cta_dq_bwd`` both), the deterministic head-dim-split pair above 128."""
    for d, name in ((40, "cta"), (64, "cta"), (96, "cta"), (128, "cta"), (256, "split")):
        q = jax.ShapeDtypeStruct((1, 256, 4, d), jnp.bfloat16)
        k = jax.ShapeDtypeStruct((1, 64, 2, d), jnp.bfloat16)
        ints = [jax.ShapeDtypeStruct(shape, jnp.int32) for shape in ((256,), (64,))]
        lse = jax.ShapeDtypeStruct((1, 4, 256), jnp.float32)
        backward_used.clear()
        jax.eval_shape(
            functools.partial(ph.backward_step, causal=True, softmax_scale=0.1, interpret=True),
            q,
            k,
            k,
            q,
            lse,
            lse,
            *ints,
            None,
            None,
        )
        assert backward_used == [name], d
    assert ph.deterministic_block_sizes(None, 64).backward == "mosaic"


def test_default_backward_follows_the_mask(backward_used):
    """``backward_step`` without block sizes takes the defaults of its head dim *and mask*: at head
    dim 64 the causal backward runs with 240 registers, the unmasked one with 232."""
    q = jax.ShapeDtypeStruct((1, 256, 4, 64), jnp.bfloat16)
    ints = jax.ShapeDtypeStruct((256,), jnp.int32)
    lse = jax.ShapeDtypeStruct((1, 4, 256), jnp.float32)
    for causal in (True, False):
        jax.eval_shape(
            functools.partial(ph.backward_step, causal=causal, softmax_scale=0.1, interpret=True),
            q,
            q,
            q,
            q,
            lse,
            lse,
            ints,
            ints,
            None,
            None,
        )
    assert backward_used == ["cta", "cta"]
    assert backward_used.block_sizes == [ph.default_block_sizes(64, True), ph.default_block_sizes(64, False)]
    assert [bs.registers for bs in backward_used.block_sizes] == [240, 232]


def test_fused_backward_above_head_dim_128_is_refused(backward_used):
    """``BlockSizes(backward="fused")`` above head dim 128 is a ValueError naming the head dim and
    "mosaic" (the backward there), raised before any kernel is traced, whatever the dtype; at 128
    it runs the fused kernel."""
    for d, dtype in ((129, jnp.bfloat16), (256, jnp.float16), (256, jnp.float32), (128, jnp.bfloat16)):
        q = jax.ShapeDtypeStruct((1, 128, 4, d), dtype)
        k = jax.ShapeDtypeStruct((1, 128, 2, d), dtype)
        pos = jax.ShapeDtypeStruct((128,), jnp.int32)
        lse = jax.ShapeDtypeStruct((1, 4, 128), jnp.float32)
        step = functools.partial(
            ph.backward_step,
            causal=True,
            softmax_scale=0.1,
            interpret=True,
            block_sizes=ph.BlockSizes(backward="fused"),
        )
        if d == 128:
            jax.eval_shape(step, q, k, k, q, lse, lse, pos, pos, None, None)
            continue
        with pytest.raises(ValueError, match=f"head dim {d} is above 128.*'mosaic'"):
            jax.eval_shape(step, q, k, k, q, lse, lse, pos, pos, None, None)
    assert backward_used == ["cta"]


class _Calls(list):
    """The names of the backward modules called, and (``block_sizes``) the BlockSizes each got."""

    block_sizes: list


@pytest.fixture
def backward_used(monkeypatch):
    """Records which Mosaic backward module ``pallas_hopper.backward_step`` calls and with which
    block sizes (without running it: each returns zeros of the contract's shapes)."""
    calls = _Calls()
    calls.block_sizes = []

    def fake(name):
        def backward(q, k, *args, bs, **kw):
            calls.append(name)
            calls.block_sizes.append(bs)
            return (
                jnp.zeros(q.shape, jnp.float32),
                jnp.zeros(k.shape, jnp.float32),
                jnp.zeros(k.shape, jnp.float32),
            )

        return backward

    for name, module in (("mosaic", hb), ("cta", hcb), ("split", hsb)):
        monkeypatch.setattr(module, "backward", fake(name))
    return calls


def test_bad_inputs_are_rejected_before_tracing():
    q = jnp.zeros((1, 64, 4, 64), jnp.bfloat16)
    k = jnp.zeros((1, 64, 3, 64), jnp.bfloat16)
    pos = jnp.arange(64, dtype=jnp.int32)
    kw = dict(causal=True, softmax_scale=1.0)
    with pytest.raises(ValueError, match="shapes"):
        ph.forward_step(q, k, k, pos, pos, None, None, **kw)
    k = jnp.zeros((1, 64, 2, 64), jnp.float16)
    with pytest.raises(TypeError, match="dtype"):
        ph.forward_step(q, k, k, pos, pos, None, None, **kw)
    with pytest.raises(TypeError, match="block_sizes"):
        ph.forward_step(q, q[:, :, :2], q[:, :, :2], pos, pos, None, None, block_sizes=pg.BlockSizes(), **kw)
    with pytest.raises(ValueError, match="softmax_scale"):
        ph.forward_step(q, q[:, :, :2], q[:, :, :2], pos, pos, None, None, causal=True, softmax_scale=-0.5)


def test_shared_memory_budget_is_checked():
    q = jnp.zeros((1, 128, 2, 256), jnp.bfloat16)
    pos = jnp.arange(128, dtype=jnp.int32)
    lse = jnp.zeros((1, 2, 128), jnp.float32)
    kw = dict(causal=True, softmax_scale=1.0)

    def refused(match, fn, x, kw=kw, **more):
        """``fn`` on q = k = v = do = ``x`` (lse and delta zero) raises ``match``."""
        with pytest.raises(ValueError, match=match):
            fn(x, x, x, x, lse, lse, pos, pos, None, None, **kw, **more)

    with pytest.raises(ValueError, match="shared memory"):
        ph.forward_step(q, q, q, pos, pos, None, None, block_sizes=ph.BlockSizes(block_k=128, stages=3), **kw)
    # MLA's 192-wide q tiles: three (schedule="pingpong3") do not fit beside 2 stages of k and v
    x, v128, p192 = (
        jnp.zeros((1, 192, 2, 192), q.dtype),
        jnp.zeros((1, 192, 2, 128), q.dtype),
        jnp.arange(192),
    )
    with pytest.raises(ValueError, match=r"schedule='pingpong3' \(3 query tiles\)"):
        ph.forward_step(
            x, x, v128, p192, p192, None, None, block_sizes=ph.BlockSizes(schedule="pingpong3"), **kw
        )
    # the head-dim-split pair: 2 stages at most
    refused("shared memory", ph.backward_step, q, block_sizes=ph.BlockSizes(backward="mosaic", bwd_stages=3))
    q = q[..., :128]  # the fused backward: 3 stages fit
    refused("shared memory", ph.backward_step, q, block_sizes=ph.BlockSizes(backward="fused", bwd_stages=4))
    width = lambda d: jnp.zeros(q.shape[:3] + (d,), q.dtype)  # noqa: E731
    step = dict(causal=True, softmax_scale=0.1, interpret=True)
    fused = lambda **bs: dict(bs=ph.BlockSizes(backward="fused", **bs), **step)  # noqa: E731
    # q/k and v of one head dim: v above 128 does not fit beside dk; q/k 256 not at all
    refused("must pad to at most 128", hcb.backward, width(192), kw=fused())
    with pytest.raises(ValueError, match="must pad to 64, 128 or 192"):
        hcb.backward(width(256), width(256), q, q, lse, lse, pos, pos, None, None, **fused())
    # MLA's 192 / 128: 2 stages fit, 3 do not
    mla = (width(192), width(192), q, q, lse, lse, pos, pos, None, None)
    with pytest.raises(ValueError, match="shared memory"):
        hcb.backward(*mla, **fused(bwd_stages=3))
    assert hcb.smem_bytes(192, q.dtype, 2, 128) <= ph.SMEM_LIMIT - 4096


def test_registered_and_not_picked_on_cpu():
    assert "pallas_hopper" in implementations.names()
    impl = implementations.resolve("pallas_hopper")
    assert impl.platforms == ("gpu",)
    if jax.default_backend() == "cpu":
        assert not ph.available()
        assert implementations.resolve("auto").name != "pallas_hopper"
