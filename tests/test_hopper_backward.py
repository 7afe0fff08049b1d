"""The Pallas Mosaic GPU (Hopper) backward steps, run in Mosaic GPU's interpret mode on CPU (what that
checks and what only the device does: hopper_cases.py).

All backwards are checked against the float32 step reference: the two-kernel Mosaic GPU one (what
``deterministic=True`` runs), the fused Mosaic GPU one (``BlockSizes(backward="fused")``, the default
at head dims 64 and 128; its TMA reduce-add of dq becomes a read-modify-write in interpret mode, see
``fused_bwd``; above head dim 128 "mosaic" is the head-dim-split pair, ``split_bwd``) and the Triton
step's kernels (``BlockSizes(backward="triton")``), over GQA groups, masks, segment ids, ragged
shards and rotated key CTAs; and ``split_group`` (a key CTA per query head) with the rule that picks
it.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from hopper_cases import RTOL, _check_backward, _check_forward, _inputs, needs_interpret
from ringcheck import rel_err

from ringattention.kernels.hopper import fused_bwd as hfb
from ringattention.kernels.hopper import pallas_hopper as ph
from ringattention.kernels.triton import pallas_gpu as pg


@needs_interpret
@pytest.mark.parametrize("backward", ph.BACKWARDS)
def test_backward_step_matches_reference(backward):
    rng = np.random.default_rng(5)
    inputs = _inputs(
        rng, sq=72, sk=80, heads=2, kv_heads=1, dim=64, dtype="bfloat16", where="overlap", segments=True
    )
    _check_backward(inputs, True, ph.BlockSizes(backward=backward))


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
