"""Pallas TPU ring step (``implementation="pallas_tpu"``) in interpret mode on CPU.

Ring-level: ``check_ring`` against the float64 reference (forward and gradients) with Pallas'
generic interpreter, a covering subset by default and the full product under ``slow``. Kernel-level:
one step against a float64 step in TPU interpret mode (``pltpu.InterpretParams``: uninitialised VMEM
is NaN, out-of-bounds reads raise), with random global offsets and a step in which every block is
skipped; the optional step features (soft cap, bidirectional prefix, bidirectional segments, v head
dim) alone and together, and their forward and backward compiled for a v5e chip by the TPU compiler.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from ringcheck import F32_RTOL, Problem, check_ring, rel_err, tpu_devices

from ringattention import masks, ring_attention
from ringattention.kernels.tpu import pallas_tpu
from ringattention.kernels.tpu.blocks import BlockSizes, fetch_index, pick_block

SMALL = BlockSizes(128, 128, 128, 128)
TPU_INTERPRET = pltpu.InterpretParams() if hasattr(pltpu, "InterpretParams") else True


def ring(pb: Problem, block_sizes=SMALL):
    return check_ring(pb, implementation="pallas_tpu", interpret=True, block_sizes=block_sizes)


# (n, layout, causal, segments, kv_heads, dtype, shard, head_dim): every ring size, layout, mask
# kind, GQA ratio and dtype appears; shard 256 with 128 blocks mixes SKIP/PARTIAL/FULL in a step.
COVER = [
    (1, "contiguous", True, False, 2, "float32", 256, 128),
    (2, "zigzag", True, True, 1, "float32", 128, 128),
    (3, "striped", False, False, 4, "bfloat16", 128, 128),
    (4, "zigzag", True, False, 2, "bfloat16", 256, 128),
    (4, "contiguous", False, True, 4, "float32", 128, 128),
    (8, "striped", True, True, 1, "float32", 128, 128),
    (8, "contiguous", True, False, 2, "bfloat16", 128, 128),
    (2, "striped", True, True, 2, "float32", 256, 64),  # head_dim 64: the [B, H, S, D] view
]


@pytest.mark.parametrize("n,layout,causal,segments,kv_heads,dtype,shard,head_dim", COVER)
def test_ring_cover(n, layout, causal, segments, kv_heads, dtype, shard, head_dim):
    ring(
        Problem(
            n=n,
            layout=layout,
            causal=causal,
            segments=segments,
            batch=1,
            shard=shard,
            heads=4,
            kv_heads=kv_heads,
            head_dim=head_dim,
            dtype=dtype,
        )
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "n,layout,causal,segments,kv_heads,dtype",
    list(
        itertools.product(
            (1, 2, 3, 4, 8),
            ("contiguous", "striped", "zigzag"),
            (True, False),
            (False, True),
            (1, 2, 4),
            ("float32", "bfloat16"),
        )
    ),
)
def test_ring_full(n, layout, causal, segments, kv_heads, dtype):
    ring(
        Problem(
            n=n,
            layout=layout,
            causal=causal,
            segments=segments,
            batch=2,
            shard=256,
            heads=4,
            kv_heads=kv_heads,
            head_dim=128,
            dtype=dtype,
        )
    )


WINDOW_COVER = [  # (n, layout, causal, segments, kv_heads, dtype, window), shard 256, head dim 128
    pytest.param(
        4,
        "contiguous",
        True,
        False,
        2,
        "float32",
        200,  # one hop; edge blocks
        marks=pytest.mark.slow,
    ),
    pytest.param(3, "zigzag", False, True, 1, "bfloat16", 300, marks=pytest.mark.slow),
    pytest.param(2, "striped", True, True, 4, "float32", 90, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("n,layout,causal,segments,kv_heads,dtype,window", WINDOW_COVER)
def test_ring_with_window(n, layout, causal, segments, kv_heads, dtype, window):
    ring(
        Problem(
            n=n,
            layout=layout,
            causal=causal,
            segments=segments,
            batch=1,
            shard=256,
            heads=4,
            kv_heads=kv_heads,
            head_dim=128,
            dtype=dtype,
            window=window,
        )
    )


# (n, layout, segments, kv_heads, head_dim, v_head_dim, softcap, prefix, bidirectional, sinks), all
# causal (prefix and bidirectional segments relax it), float32, batch 2 (a row without a prefix)
FEATURE_RING = [
    (1, "contiguous", False, 2, 128, None, 2.0, True, False, False),
    (2, "zigzag", True, 1, 128, None, 2.0, False, True, True),  # sinks merged around the kernel
    (4, "striped", False, 2, 192, 128, None, True, False, False),  # MLA head dims
    (3, "zigzag", True, 2, 192, 128, 2.0, True, True, False),  # everything together
]


@pytest.mark.parametrize(
    "n,layout,segments,kv_heads,head_dim,v_head_dim,softcap,prefix,bidir,sinks", FEATURE_RING
)
def test_ring_optional_features(
    n, layout, segments, kv_heads, head_dim, v_head_dim, softcap, prefix, bidir, sinks
):
    ring(
        Problem(
            n=n,
            layout=layout,
            causal=True,
            segments=segments,
            batch=2,
            shard=128,
            heads=4,
            kv_heads=kv_heads,
            head_dim=head_dim,
            v_head_dim=v_head_dim,
            softcap=softcap,
            prefix=prefix,
            bidirectional=bidir,
            sinks=sinks,
        )
    )


def test_ring_default_block_sizes():
    ring(Problem(n=2, layout="zigzag", shard=384, head_dim=128, batch=1), block_sizes=None)


# ------------------------------------------------------------------------------------ one step


def step64(
    q,
    k,
    v,
    do,
    q_pos,
    k_pos,
    q_seg,
    k_seg,
    causal,
    scale,
    window=None,
    softcap=None,
    prefix=None,
    bidirectional=False,
):
    """Float64 attention of one step over its visible keys and its gradients (kernel layouts; v and
    do may have their own head dim). ``softcap``/``prefix``/``bidirectional``: the optional step
    features (``implementations.py``)."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    G = q.shape[2] // k.shape[2]
    kr, vr = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)
    vis = np.asarray(
        masks.visible(q_pos, k_pos, q_seg, k_seg, causal, window, prefix=prefix, bidirectional=bidirectional)
    )[:, None]
    s = np.einsum("bqhd,bkhd->bhqk", q, kr) * scale
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    s = np.where(vis, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    l = e.sum(-1, keepdims=True)
    p = e / np.where(l > 0, l, 1.0)
    lse = np.where(l[..., 0] > 0, m[..., 0] + np.log(np.where(l[..., 0] > 0, l[..., 0], 1.0)), -np.inf)
    o = np.einsum("bhqk,bkhd->bqhd", p, vr)
    dp = np.einsum("bqhd,bkhd->bhqk", do, vr)
    delta = np.einsum("bqhd,bqhd->bhq", o, do)
    ds = p * (dp - delta[..., None]) * scale
    if softcap is not None:
        ds = ds * (1.0 - np.where(vis, s / softcap, 0.0) ** 2)
    fold = lambda x: x.reshape(*k.shape[:3], G, x.shape[-1]).sum(3)
    dk = fold(np.einsum("bhqk,bqhd->bkhd", ds, q))
    dv = fold(np.einsum("bhqk,bqhd->bkhd", p, do))
    return o, lse, delta, np.einsum("bhqk,bkhd->bqhd", ds, kr), dk, dv


def _step_inputs(seed, B, S, H, K, D, segments):
    rng = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
    q, k, v, do = f(B, S, H, D), f(B, S, K, D), f(B, S, K, D), f(B, S, H, D)
    stride = int(rng.integers(1, 4))
    q_pos = jnp.asarray(rng.integers(0, 300) + stride * np.arange(S), jnp.int32)
    k_pos = jnp.asarray(rng.integers(0, 300) + stride * np.arange(S), jnp.int32)
    seg = None
    if segments:
        seg = jnp.asarray(np.sort(rng.integers(0, 3, (B, S)), axis=1), jnp.int32)
    return q, k, v, do, q_pos, k_pos, seg


def _compare_step(q, k, v, do, q_pos, k_pos, q_seg, k_seg, causal, scale, **features):
    """forward_step / backward_step in TPU interpret mode against :func:`step64` (o, lse, dq, dk, dv)."""
    kw = dict(
        causal=causal,
        softmax_scale=scale,
        block_sizes=SMALL,
        interpret=TPU_INTERPRET,
        **{n: x for n, x in features.items() if x is not None and x is not False},
    )
    o, lse = pallas_tpu.forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, **kw)
    o64, lse64, delta, dq64, dk64, dv64 = step64(
        q, k, v, do, q_pos, k_pos, q_seg, k_seg, causal, scale, **features
    )
    lse, lse_ref = np.asarray(lse), lse64
    assert np.array_equal(np.isneginf(lse), np.isneginf(lse_ref)), "rows seeing no key differ"
    seen = ~np.isneginf(lse_ref)
    assert seen.any(), "test setup: no query sees a key"
    assert rel_err(np.where(seen, lse, 0.0), np.where(seen, lse_ref, 0.0)) <= F32_RTOL
    assert o.shape == o64.shape and rel_err(o, o64) <= F32_RTOL
    grads = pallas_tpu.backward_step(
        q,
        k,
        v,
        do,
        jnp.asarray(lse_ref, jnp.float32),
        jnp.asarray(delta, jnp.float32),
        q_pos,
        k_pos,
        q_seg,
        k_seg,
        **kw,
    )
    for name, got, want in zip(("dq", "dk", "dv"), grads, (dq64, dk64, dv64), strict=True):
        assert got.shape == want.shape and rel_err(got, want) <= F32_RTOL, name


@pytest.mark.parametrize(
    "seed,causal,segments,kv_heads,window",
    [
        (0, True, False, 2, None),
        (1, True, True, 1, None),
        (2, False, True, 4, None),
        (3, False, False, 2, 200),
    ],
)  # window: symmetric, random offsets
def test_step_random_offsets(seed, causal, segments, kv_heads, window):
    B, S, H, D = 2, 256, 4, 128
    q, k, v, do, q_pos, k_pos, seg = _step_inputs(seed, B, S, H, kv_heads, D, segments)
    _compare_step(q, k, v, do, q_pos, k_pos, seg, seg, causal, D**-0.5, window=window)


SOFTCAP = 2.0  # scaled logits of unit-normal q, k are ~N(0, 1): the cap bends the large ones


def _feature_inputs(seed, B, S, H, K, D, Dv, segments, bidirectional, prefix):
    """Step inputs with v/do of head dim Dv, independent query/key segment ids (negative ids with
    ``bidirectional``) and a prefix per batch row reaching into the keys (row 0: none)."""
    q, k, _, _, q_pos, k_pos, _ = _step_inputs(seed, B, S, H, K, D, False)
    rng = np.random.default_rng(seed + 100)
    f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    v, do = f(B, S, K, Dv), f(B, S, H, Dv)
    lo = -2 if bidirectional else 0
    ids = lambda: jnp.asarray(np.sort(rng.integers(lo, 2, (B, S)), axis=1), jnp.int32)  # noqa: E731
    q_seg, k_seg = (ids(), ids()) if segments else (None, None)
    pre = None
    if prefix:
        span = int(k_pos[-1] - k_pos[0]) + 1
        pre = jnp.asarray(int(k_pos[0]) + rng.integers(0, span, B), jnp.int32).at[0].set(0)
    return q, k, v, do, q_pos, k_pos, q_seg, k_seg, pre


FEATURE_CASES = [  # (seed, causal, segments, kv_heads, D, Dv, window, softcap, prefix, bidir)
    (10, True, False, 2, 128, 128, None, SOFTCAP, False, False),  # softcap alone, GQA
    (11, False, True, 4, 128, 128, 200, SOFTCAP, False, False),  # window + softcap, segments
    (12, True, False, 2, 128, 128, None, None, True, False),  # prefix alone
    (13, True, True, 1, 128, 128, None, None, False, True),  # bidirectional segments alone
    (14, True, False, 2, 192, 128, None, None, False, False),  # MLA head dims
    (15, False, False, 4, 128, 64, None, SOFTCAP, False, False),  # Dv 64: the [B, K, S, Dv] view
    (21, True, True, 2, 192, 128, 90, SOFTCAP, True, True),  # everything together
    (17, True, True, 1, 128, 128, None, SOFTCAP, True, False),  # prefix + segments + softcap
]


@pytest.mark.parametrize("seed,causal,segments,kv_heads,D,Dv,window,softcap,prefix,bidir", FEATURE_CASES)
def test_step_optional_features(seed, causal, segments, kv_heads, D, Dv, window, softcap, prefix, bidir):
    B, S, H = 2, 256, 4
    q, k, v, do, q_pos, k_pos, q_seg, k_seg, pre = _feature_inputs(
        seed, B, S, H, kv_heads, D, Dv, segments, bidir, prefix
    )
    _compare_step(
        q,
        k,
        v,
        do,
        q_pos,
        k_pos,
        q_seg,
        k_seg,
        causal,
        D**-0.5,
        window=window,
        softcap=softcap,
        prefix=pre,
        bidirectional=bidir,
    )


def test_step_feature_arguments_are_checked():
    q, k, v, qp, kp, _, _ = _args()
    kw = dict(softmax_scale=1.0, interpret=True)
    seg, pre = jnp.zeros((1, 256), jnp.int32), jnp.zeros((1,), jnp.int32)
    with pytest.raises(ValueError, match="needs causal=True"):
        pallas_tpu.forward_step(q, k, v, qp, kp, None, None, causal=False, prefix=pre, **kw)
    with pytest.raises(ValueError, match=r"prefix must be int32 \[B\]"):
        pallas_tpu.forward_step(q, k, v, qp, kp, None, None, causal=True, prefix=pre[:0], **kw)
    with pytest.raises(ValueError, match="segment ids"):
        pallas_tpu.forward_step(q, k, v, qp, kp, None, None, causal=True, bidirectional=True, **kw)
    with pytest.raises(ValueError, match="softcap"):
        pallas_tpu.forward_step(q, k, v, qp, kp, seg, seg, causal=True, softcap=0.0, **kw)
    with pytest.raises(ValueError, match="Dv"):
        pallas_tpu.forward_step(q, k, v[:, :128], qp, kp, None, None, causal=True, **kw)


def test_step_all_skipped_is_zero_not_nan():
    B, S, H, K, D = 1, 256, 2, 1, 128
    q, k, v, do, _, _, _ = _step_inputs(3, B, S, H, K, D, False)
    q_pos = jnp.arange(S, dtype=jnp.int32)
    k_pos = q_pos + S  # every key is in the future of every query
    kw = dict(causal=True, softmax_scale=0.1, block_sizes=SMALL, interpret=TPU_INTERPRET)
    o, lse = pallas_tpu.forward_step(q, k, v, q_pos, k_pos, None, None, **kw)
    assert not np.any(np.isnan(o)) and np.all(np.asarray(o) == 0)
    assert np.all(np.isneginf(lse))
    neg_inf = jnp.full((B, H, S), -jnp.inf, jnp.float32)
    grads = pallas_tpu.backward_step(
        q, k, v, do, neg_inf, jnp.zeros((B, H, S)), q_pos, k_pos, None, None, **kw
    )
    for g in grads:
        assert not np.any(np.isnan(g)) and np.all(np.asarray(g) == 0)


# ---------------------------------------------------------------------------- blocks and errors


def test_fetch_index_points_at_computed_blocks():
    kind = jnp.asarray(np.random.default_rng(0).integers(0, 3, (2, 5, 7)), jnp.int32)
    kind = kind.at[0, 1].set(masks.SKIP)  # a row with nothing to compute
    fetch, kind = np.asarray(fetch_index(kind)), np.asarray(kind)
    live = kind != masks.SKIP
    j = np.broadcast_to(np.arange(kind.shape[-1]), kind.shape)
    assert np.all(fetch[live] == j[live])
    has_live = live.any(-1, keepdims=True) & ~live
    picked = np.take_along_axis(live, fetch, axis=-1)
    assert np.all(picked[np.broadcast_to(has_live, kind.shape)])
    assert np.all((fetch >= 0) & (fetch < kind.shape[-1]))


@pytest.mark.parametrize(
    "kind", ["TPU v4", "TPU v5 lite", "TPU v5p", "TPU v6 lite", "TPU7x", "cpu", "unknown"]
)
def test_for_chip_defaults_are_tpu_aligned(kind):
    bs = BlockSizes.for_chip(kind)
    assert all(getattr(bs, f) % 128 == 0 for f in ("block_q", "block_kv", "block_q_bwd", "block_kv_bwd"))


@pytest.mark.parametrize("length,wanted", [(384, 512), (640, 512), (1024, 256)])
def test_default_blocks_divide_the_shard(length, wanted):
    block = pick_block(length, wanted, "block_q", explicit=False)
    assert length % block == 0 and block % 128 == 0 and block <= wanted


def _args(S=256, D=128, dtype=jnp.float32):
    q = jnp.zeros((1, S, 2, D), dtype)
    k = jnp.zeros((1, S, 1, D), dtype)
    pos = jnp.arange(S, dtype=jnp.int32)
    return q, k, k, pos, pos, None, None


def test_bad_inputs_raise():
    kw = dict(causal=True, softmax_scale=1.0, interpret=True)
    with pytest.raises(ValueError, match="block_q=100"):
        BlockSizes(block_q=100)
    with pytest.raises(ValueError, match="length=200"):
        pallas_tpu.forward_step(*_args(S=200), **kw)
    with pytest.raises(ValueError, match="block_q=256"):
        pallas_tpu.forward_step(*_args(S=384), block_sizes=BlockSizes(256, 128), **kw)
    q, k, v, qp, kp, _, _ = _args()
    with pytest.raises(TypeError, match="dtype"):
        pallas_tpu.forward_step(q, k.astype(jnp.bfloat16), v, qp, kp, None, None, **kw)
    with pytest.raises(ValueError, match="q_pos.shape"):
        pallas_tpu.forward_step(q, k, v, qp[:128], kp, None, None, **kw)
    with pytest.raises(ValueError, match="q_seg and k_seg"):
        pallas_tpu.forward_step(q, k, v, qp, kp, jnp.zeros((1, 256), jnp.int32), None, **kw)
    with pytest.raises(TypeError, match="block_sizes"):
        pallas_tpu.forward_step(q, k, v, qp, kp, None, None, block_sizes=(128, 128), **kw)


def test_ring_rejects_short_shards():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("sp",))
    P = jax.sharding.PartitionSpec
    x = jnp.zeros((1, 64, 2, 128), jnp.float32)
    f = lambda q: ring_attention(q, q, q, "sp", causal=True, implementation="pallas_tpu", interpret=True)
    with pytest.raises(ValueError, match="multiples of 128"):
        jax.shard_map(f, mesh=mesh, in_specs=P(None, "sp"), out_specs=P(None, "sp"), check_vma=False)(x)


@pytest.mark.parametrize(
    "head_dim,dtype,causal,segments,window",
    [
        (128, jnp.bfloat16, True, True, None),
        (64, jnp.float32, False, False, None),
        (128, jnp.bfloat16, False, True, 300),
    ],
)
def test_lowers_to_mosaic_for_tpu(head_dim, dtype, causal, segments, window):
    # Exports for platform "tpu" from this CPU host: runs the Pallas -> Mosaic lowering (block-shape
    # tiling checks, every kernel op); Mosaic's own compile needs a TPU and is not covered.
    B, S, H, K = 1, 512, 4, 2
    arr = lambda *shape, dt=dtype: jax.ShapeDtypeStruct(shape, dt)
    q, kv, pos = arr(B, S, H, head_dim), arr(B, S, K, head_dim), arr(S, dt=jnp.int32)
    seg = arr(B, S, dt=jnp.int32) if segments else None
    rows = arr(B, H, S, dt=jnp.float32)
    kw = dict(causal=causal, softmax_scale=0.1, block_sizes=BlockSizes(256, 128, 128, 256), window=window)
    fwd = lambda q, k, v, qp, kp, qs, ks: pallas_tpu.forward_step(q, k, v, qp, kp, qs, ks, **kw)
    bwd = lambda *a: pallas_tpu.backward_step(*a, **kw)
    exported = [
        jax.export.export(jax.jit(fwd), platforms=["tpu"])(q, kv, kv, pos, pos, seg, seg),
        jax.export.export(jax.jit(bwd), platforms=["tpu"])(q, kv, kv, q, rows, rows, pos, pos, seg, seg),
    ]
    calls = sum(e.mlir_module().count("tpu_custom_call") for e in exported)
    assert calls == 3  # forward, dq, dk/dv kernels


@pytest.mark.parametrize("head_dim,v_head_dim,segments", [(192, 128, True), (128, 128, False)])
def test_optional_features_compile_for_tpu(head_dim, v_head_dim, segments):
    # The TPU compiler (libtpu, on this CPU host) compiles the forward and backward steps with
    # softcap + prefix (+ bidirectional segments) and MLA head dims through Mosaic for a v5e chip.
    sharding = jax.sharding.SingleDeviceSharding(tpu_devices()[0])
    B, S, H, K = 2, 512, 4, 2
    arr = lambda *shape, dt=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dt, sharding=sharding)  # noqa: E731
    q, k = arr(B, S, H, head_dim), arr(B, S, K, head_dim)
    v, do = arr(B, S, K, v_head_dim), arr(B, S, H, v_head_dim)
    pos, prefix, rows = arr(S, dt=jnp.int32), arr(B, dt=jnp.int32), arr(B, H, S, dt=jnp.float32)
    seg = arr(B, S, dt=jnp.int32) if segments else None
    kw = dict(
        causal=True,
        softmax_scale=0.1,
        block_sizes=BlockSizes(256, 128, 128, 256),
        softcap=30.0,
        bidirectional=segments,
    )
    fwd = lambda q, k, v, qp, kp, qs, ks, pre: pallas_tpu.forward_step(  # noqa: E731
        q, k, v, qp, kp, qs, ks, prefix=pre, **kw
    )
    bwd = lambda *a, pre: pallas_tpu.backward_step(*a, prefix=pre, **kw)  # noqa: E731
    f = jax.jit(fwd).trace(q, k, v, pos, pos, seg, seg, prefix).lower().compile()
    g = jax.jit(bwd).trace(q, k, v, do, rows, rows, pos, pos, seg, seg, pre=prefix).lower().compile()
    assert [o.shape for o in f.out_info] == [(B, S, H, v_head_dim), (B, H, S)]
    assert [o.shape for o in g.out_info] == [q.shape, k.shape, v.shape]
    assert sum(c.as_text().count('custom_call_target="tpu_custom_call"') for c in (f, g)) == 3


def test_ring_with_features_compiles_for_a_tpu_mesh_with_auto():
    # "auto" on a v5e:2x2 mesh keeps the Mosaic kernel when the call uses the optional features
    # (soft cap, a prefix per row, MLA head dims); the TPU compiler compiles forward and gradients.
    P = jax.sharding.PartitionSpec
    mesh = jax.sharding.Mesh(np.array(tpu_devices()).reshape(4), ("sp",))
    B, L, H, K = 2, 4 * 256, 4, 2
    sd = lambda *s, dt=jnp.bfloat16: jax.ShapeDtypeStruct(s, dt)  # noqa: E731
    q, k, v, prefix = sd(B, L, H, 192), sd(B, L, K, 192), sd(B, L, K, 128), sd(B, dt=jnp.int32)

    def local(q, k, v, prefix):
        return ring_attention(
            q, k, v, "sp", causal=True, layout="zigzag", logits_soft_cap=30.0, prefix_length=prefix
        )

    fn = jax.shard_map(local, mesh=mesh, in_specs=(P(None, "sp"),) * 3 + (P(),), out_specs=P(None, "sp"))
    loss = lambda q, k, v, pre: fn(q, k, v, pre).astype(jnp.float32).sum()  # noqa: E731
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, k, v, prefix).lower()
    assert grads.as_text().count("tpu_custom_call") >= 3  # forward, dq, dk/dv: not the XLA step
    compiled = grads.compile()
    assert [o.shape for o in compiled.out_info] == [q.shape, k.shape, v.shape]
