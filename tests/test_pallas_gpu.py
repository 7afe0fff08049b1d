"""The Pallas GPU (Triton) ring step: kernel-level checks and the ring matrix, in interpret mode.

On a CUDA machine (``JAX_PLATFORMS=cuda``) ``test_device_*`` also compare the compiled kernels with
cuDNN and a float32 reference at 16K tokens; on CPU they are skipped.
"""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ringcheck import BF16_RTOL, F32_RTOL, Problem, check_ring, h200_devices, on_device, rel_err

from ringattention import masks, reference_attention
from ringattention.kernels import common
from ringattention.kernels.triton import pallas_gpu as pg

# Two blocks per shard of 32: hidden, partial and full block pairs all occur within one step.
BS = pg.BlockSizes(
    block_q=16,
    block_k=16,
    fwd_warps=4,
    fwd_stages=2,
    block_q_dq=16,
    block_k_dq=16,
    block_q_dkv=16,
    block_k_dkv=16,
    bwd_warps=4,
    bwd_stages=2,
)
# Unequal blocks per kernel (and a tail block) for the kernel-level tests.
BS_MIXED = pg.BlockSizes(block_q=32, block_k=16, block_q_dq=16, block_k_dq=32, block_q_dkv=32, block_k_dkv=16)
RTOL = {"float32": F32_RTOL, "bfloat16": BF16_RTOL}
LSE_RTOL = F32_RTOL  # log-sum-exps are float32 sums of float32 logits, for bf16 inputs too
# bf16 kernels against cuDNN on device: error vs float32 reference at most this factor of cuDNN's.
DEVICE_ERR_FACTOR = 1.5


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


# ---- the ring matrix ---------------------------------------------------------------------------

RINGS = (1, 2, 3, 4, 8)
LAYOUTS = ("contiguous", "striped", "zigzag")
ALL_CASES = list(
    itertools.product(RINGS, LAYOUTS, (True, False), (False, True), (1, 2, 4), ("float32", "bfloat16"))
)
# A covering subset for the default run: every value of every axis, every ring size.
DEFAULT_CASES = [
    (1, "contiguous", True, False, 2, "float32"),
    (1, "zigzag", False, True, 4, "bfloat16"),
    (2, "striped", True, True, 1, "float32"),
    (2, "contiguous", False, False, 4, "bfloat16"),
    (3, "zigzag", True, False, 4, "float32"),
    (3, "striped", False, True, 2, "bfloat16"),
    (4, "contiguous", True, True, 4, "float32"),
    (4, "zigzag", True, True, 2, "bfloat16"),
    (8, "striped", True, True, 2, "float32"),
    (8, "contiguous", True, False, 1, "bfloat16"),
    (8, "zigzag", False, False, 2, "float32"),
]


def _id(case):
    n, layout, causal, seg, kvh, dtype = case
    return f"n{n}-{layout}-{'causal' if causal else 'full'}-{'seg' if seg else 'noseg'}-kv{kvh}-{dtype}"


def _ring_case(case):
    n, layout, causal, seg, kvh, dtype = case
    check_ring(
        Problem(n=n, layout=layout, causal=causal, segments=seg, kv_heads=kvh, dtype=dtype, shard=32),
        implementation="pallas_gpu",
        interpret=True,
        block_sizes=BS,
    )


@pytest.mark.parametrize("case", DEFAULT_CASES, ids=map(_id, DEFAULT_CASES))
def test_ring_matrix(case):
    _ring_case(case)


WINDOW_CASES = [  # (n, layout, causal, segments, kv_heads, dtype, window): shard 32
    (4, "contiguous", True, False, 1, "bfloat16", 24),  # a short lap of one hop
    pytest.param(2, "zigzag", True, True, 2, "float32", 20, marks=pytest.mark.slow),
    pytest.param(3, "striped", False, True, 4, "float32", 40, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("n,layout,causal,seg,kvh,dtype,window", WINDOW_CASES)
def test_ring_with_window(n, layout, causal, seg, kvh, dtype, window):
    check_ring(
        Problem(
            n=n,
            layout=layout,
            causal=causal,
            segments=seg,
            kv_heads=kvh,
            dtype=dtype,
            shard=32,
            window=window,
        ),
        implementation="pallas_gpu",
        interpret=True,
        block_sizes=BS,
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in ALL_CASES if c not in DEFAULT_CASES], ids=_id)
def test_ring_matrix_full(case):
    _ring_case(case)


# Rings with the optional features (ringcheck's Problem fields), each case a few seconds: the
# float64 reference of the whole sequence, through ring_attention's keywords to the kernels.
FEATURE_RINGS = [  # (n, layout, kv_heads, segments, features)
    (1, "contiguous", 2, True, dict(softcap=2.0, logit_scale=3.0, v_head_dim=8)),
    (2, "zigzag", 1, True, dict(prefix=True, batch=3, bidirectional=True)),
    (3, "striped", 2, False, dict(softcap=2.0, logit_scale=3.0, prefix=True, batch=3, sinks=True)),
    (4, "contiguous", 4, True, dict(bidirectional=True, v_head_dim=8, window=20)),
    (
        3,
        "zigzag",
        2,
        True,
        dict(
            softcap=2.0,
            logit_scale=3.0,
            prefix=True,
            bidirectional=True,
            sinks=True,
            v_head_dim=8,
            dtype="bfloat16",
        ),
    ),
]


@pytest.mark.parametrize(
    "n,layout,kvh,seg,features", FEATURE_RINGS, ids=lambda c: "-".join(c) if isinstance(c, dict) else str(c)
)
def test_ring_with_features(n, layout, kvh, seg, features):
    check_ring(
        Problem(n=n, layout=layout, kv_heads=kvh, segments=seg, shard=32, **features),
        implementation="pallas_gpu",
        interpret=True,
        block_sizes=BS,
    )


# ---- on a CUDA device only ---------------------------------------------------------------------

on_gpu = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a CUDA GPU")


def _grads(fn, q, k, v, do):
    o, vjp = jax.vjp(fn, q, k, v)
    return (o, *vjp(do.astype(o.dtype)))


@on_gpu
@pytest.mark.parametrize("causal", (True, False))
@pytest.mark.parametrize("dims", ((8, 2, 128), (4, 4, 64)), ids=("gqa-d128", "mha-d64"))
def test_device_matches_cudnn_at_16k(causal, dims):
    heads, kv_heads, dim = dims
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("sp",))
    spec = jax.sharding.PartitionSpec(None, "sp")
    ring = jax.shard_map(
        lambda q, k, v: pg_ring(q, k, v, causal),
        mesh=mesh,
        in_specs=(spec,) * 3,
        out_specs=spec,
        check_vma=False,
    )
    cudnn = lambda q, k, v: jax.nn.dot_product_attention(  # noqa: E731
        q, k, v, is_causal=causal, implementation="cudnn"
    )
    ref = lambda q, k, v: reference_attention(q, k, v, causal=causal)  # noqa: E731
    keys = jax.random.split(jax.random.PRNGKey(dim + causal), 4)
    shape = lambda h: (1, 16384, h, dim)  # noqa: E731
    q, do = (jax.random.normal(keys[i], shape(heads), jnp.bfloat16) for i in (0, 3))
    k, v = (jax.random.normal(keys[i], shape(kv_heads), jnp.bfloat16) for i in (1, 2))
    f32 = [x.astype(jnp.float32) for x in (q, k, v, do)]
    want = jax.jit(lambda *a: _grads(ref, *a))(*f32)
    ours = jax.jit(lambda *a: _grads(ring, *a))(q, k, v, do)
    base = jax.jit(lambda *a: _grads(cudnn, *a))(q, k, v, do)
    for name, o, b, w in zip(("o", "dq", "dk", "dv"), ours, base, want, strict=True):
        err, base_err = rel_err(o, w), rel_err(b, w)
        print(f"{name}: pallas_gpu {err:.2e} cudnn {base_err:.2e} vs f32; ours vs cudnn {rel_err(o, b):.2e}")
        assert err <= DEVICE_ERR_FACTOR * base_err, name


@on_gpu
@pytest.mark.parametrize("causal", (True, False))
def test_device_features_match_reference(causal):
    """The compiled kernels with every feature (MLA's head dims 192 and 128, soft cap, window and,
    causal, a prefix per row and bidirectional segments) against the float32 reference step."""
    case = FeatureCase(
        dtype="bfloat16",
        causal=causal,
        segments=True,
        kv_heads=2,
        sq=2048,
        sk=2048,
        dim=192,
        dim_v=128,
        softcap=30.0,
        window=1500,
        prefix=(700, 0) if causal else None,
        bidirectional=causal,
    )
    q, k, v, do, q_pos, k_pos, q_seg, k_seg = _feature_inputs(case)
    kw = case.keywords()
    fwd = jax.jit(lambda *a: pg.forward_step(*a, **kw))
    bwd = jax.jit(lambda *a: pg.backward_step(*a, **kw))
    o, lse = fwd(q, k, v, q_pos, k_pos, q_seg, k_seg)
    ro, rlse = pg.reference_forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, **kw)
    delta = jnp.einsum("bshd,bshd->bhs", ro, do.astype(jnp.float32))
    grads = bwd(q, k, v, do, rlse, delta, q_pos, k_pos, q_seg, k_seg)
    rgrads = pg.reference_backward_step(q, k, v, do, rlse, delta, q_pos, k_pos, q_seg, k_seg, **kw)
    _assert_close((o, lse, *grads), (ro, rlse, *rgrads), BF16_RTOL, "compiled vs reference")


def pg_ring(q, k, v, causal):
    from ringattention import ring_attention

    return ring_attention(q, k, v, "sp", causal=causal, implementation="pallas_gpu")


# ---- optional features (implementations.py): softcap, prefix, bidirectional, v_head_dim ----------


@dataclasses.dataclass(frozen=True)
class FeatureCase:
    """One step with optional features; consecutive positions ``offset + i`` for queries, ``i``
    for keys (times ``stride``), batch 2, 4 query heads, documents derived from positions."""

    dtype: str = "float32"
    causal: bool = True
    segments: bool = False
    kv_heads: int = 2
    sq: int = 48
    sk: int = 48
    dim: int = 32
    dim_v: int | None = None  # v's own head dim
    softcap: float | None = None
    prefix: tuple[int, int] | None = None  # per batch row, in positions
    bidirectional: bool = False  # odd documents get negative ids
    window: int | None = None
    offset: int = 0
    stride: int = 1

    def __str__(self):
        default = FeatureCase()
        return (
            "-".join(
                f"{f.name}={getattr(self, f.name)}"
                for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(default, f.name)
            )
            or "default"
        )

    def keywords(self) -> dict:
        kw = dict(
            causal=self.causal,
            softmax_scale=self.dim**-0.5,
            window=self.window,
            softcap=self.softcap,
            bidirectional=self.bidirectional,
        )
        kw["prefix"] = None if self.prefix is None else jnp.asarray(self.prefix, jnp.int32)
        return kw


def _feature_inputs(case: FeatureCase):
    rng = np.random.default_rng(case.sq * case.sk + case.dim + (case.dim_v or 0))
    f = lambda *s: jnp.asarray(rng.standard_normal(s), case.dtype)  # noqa: E731
    dv = case.dim_v or case.dim
    q, do = f(2, case.sq, 4, case.dim), f(2, case.sq, 4, dv)
    k, v = f(2, case.sk, case.kv_heads, case.dim), f(2, case.sk, case.kv_heads, dv)
    q_pos = (np.arange(case.sq) + case.offset) * case.stride
    k_pos = np.arange(case.sk) * case.stride
    q_seg = k_seg = None
    if case.segments:  # documents: 3 random boundaries per row over all positions
        top = max(q_pos[-1], k_pos[-1]) + 1
        bounds = np.sort(rng.integers(1, top, (2, 3)), axis=1)
        doc = lambda pos: np.stack([np.searchsorted(b, pos, side="right") for b in bounds])  # noqa: E731
        q_seg, k_seg = doc(q_pos), doc(k_pos)  # [2, S]
        if case.bidirectional:
            q_seg, k_seg = (np.where(s % 2 == 1, -s, s) for s in (q_seg, k_seg))
        q_seg, k_seg = jnp.asarray(q_seg, jnp.int32), jnp.asarray(k_seg, jnp.int32)
    q_pos, k_pos = jnp.asarray(q_pos, jnp.int32), jnp.asarray(k_pos, jnp.int32)
    return q, k, v, do, q_pos, k_pos, q_seg, k_seg


def _step64(inputs, causal, softmax_scale, window, softcap, prefix, bidirectional):
    """float64 numpy forward and backward of one step: o, lse, delta, dq, dk, dv (the backward on
    this step's own lse and delta)."""
    q, k, v, do = (np.asarray(x, np.float64) for x in inputs[:4])
    B, Sq, H, D = q.shape
    K, G = k.shape[2], H // k.shape[2]
    vis = np.asarray(masks.visible(*inputs[4:], causal, window, prefix=prefix, bidirectional=bidirectional))[
        :, None, None
    ]  # [B|1,1,1,Sq,Sk]
    qg, dog = q.reshape(B, Sq, K, G, D), do.reshape(B, Sq, K, G, -1)
    s = np.einsum("bqkgd,bskd->bkgqs", qg, k) * softmax_scale
    t = np.tanh(s / softcap) if softcap is not None else None
    s = np.where(vis, s if t is None else softcap * t, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    l = np.exp(s - m).sum(-1, keepdims=True)  # noqa: E741
    p = np.exp(s - m) / np.where(l > 0, l, 1.0)  # [B, K, G, Sq, Sk]
    lse = np.where(l[..., 0] > 0, m[..., 0] + np.log(np.where(l > 0, l, 1.0))[..., 0], -np.inf)
    o = np.einsum("bkgqs,bskd->bqkgd", p, v).reshape(B, Sq, H, -1)
    delta = np.einsum("bqhd,bqhd->bhq", o, do)
    dp = np.einsum("bqkgd,bskd->bkgqs", dog, v)
    ds = p * (dp - delta.reshape(B, K, G, Sq)[..., None]) * softmax_scale
    ds = ds if t is None else ds * (1.0 - t * t)
    dq = np.einsum("bkgqs,bskd->bqkgd", ds, k).reshape(B, Sq, H, D)
    dk = np.einsum("bkgqs,bqkgd->bskd", ds, qg)
    dv = np.einsum("bkgqs,bqkgd->bskd", p, dog)
    return o, lse.reshape(B, H, Sq), delta, dq, dk, dv


def _assert_close(got, want, rtol, what):
    """o/lse/dq/dk/dv of ``got`` against ``want``: the same rows see nothing (lse -inf), finite
    lse within LSE_RTOL, the rest within ``rtol``."""
    lse, rlse = np.asarray(got[1]), np.asarray(want[1])
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(rlse), what)
    finite = np.isfinite(rlse)
    assert rel_err(lse[finite], rlse[finite]) <= LSE_RTOL, f"{what}: lse"
    for name, g, w in zip(("o", "dq", "dk", "dv"), got[:1] + got[2:], want[:1] + want[2:], strict=True):
        assert g.shape == w.shape, f"{what}: {name} {g.shape} != {w.shape}"
        assert rel_err(g, w) <= rtol, f"{what}: {name} {rel_err(g, w):.2e} > {rtol}"


def _check_features(case: FeatureCase, block_sizes=BS_MIXED):
    inputs = _feature_inputs(case)
    q, k, v, do, q_pos, k_pos, q_seg, k_seg = inputs
    kw = case.keywords()
    o64, lse64, delta64, *grads64 = _step64(inputs, **kw)
    lse, delta = jnp.asarray(lse64, jnp.float32), jnp.asarray(delta64, jnp.float32)
    o, lse_k = pg.forward_step(
        q, k, v, q_pos, k_pos, q_seg, k_seg, block_sizes=block_sizes, interpret=True, **kw
    )
    grads = pg.backward_step(
        q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, block_sizes=block_sizes, interpret=True, **kw
    )
    ro, rlse = pg.reference_forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, **kw)
    rgrads = pg.reference_backward_step(q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, **kw)
    kernel, ref32, ref64 = (o, lse_k, *grads), (ro, rlse, *rgrads), (o64, lse64, *grads64)
    _assert_close(kernel, ref32, RTOL[case.dtype], "kernel vs float32 reference")
    _assert_close(kernel, ref64, RTOL[case.dtype], "kernel vs float64")
    _assert_close(ref32, ref64, F32_RTOL, "float32 reference vs float64")
    assert np.any(np.isfinite(lse64)), "the step sees nothing: a vacuous case"


FEATURE_CASES = [
    FeatureCase(softcap=2.0),  # causal, GQA
    FeatureCase(dtype="bfloat16", causal=False, segments=True, kv_heads=1, softcap=1.5),
    FeatureCase(segments=True, softcap=2.0, window=20, offset=8, sk=64),  # ragged window edge
    FeatureCase(causal=False, kv_heads=4, softcap=3.0, window=24, sq=40),  # ragged query shard
    FeatureCase(prefix=(30, 0), stride=2),  # row 0 sees keys ahead of it, row 1 is plain causal
    FeatureCase(dtype="bfloat16", prefix=(50, 17), window=24, sq=32, sk=64),  # 24..49: prefix, not window
    FeatureCase(segments=True, bidirectional=True, sq=40),
    FeatureCase(dtype="bfloat16", segments=True, bidirectional=True, kv_heads=1, offset=16),
    FeatureCase(causal=False, dim=48, dim_v=32),  # head dims padded separately: 64 and 32
    FeatureCase(dtype="bfloat16", segments=True, dim=24, dim_v=16, sk=40),
    FeatureCase(segments=True, softcap=2.0, prefix=(20, 40), bidirectional=True, dim=32, dim_v=16),
    FeatureCase(
        segments=True,
        softcap=2.5,
        prefix=(12, 50),
        bidirectional=True,
        window=28,
        dim_v=48,
        kv_heads=1,
        offset=4,
        sk=64,
    ),
]


@pytest.mark.parametrize("case", FEATURE_CASES, ids=str)
def test_step_features_match_references(case):
    _check_features(case)


def _lowered_triton_calls(fn, *args) -> int:
    """Triton custom calls of ``fn`` lowered for an H200 (Pallas' Triton lowering, which since jax
    0.11 reads the target GPU from the devices: XLA's deviceless ones, no GPU needed)."""
    h200 = h200_devices(1)[0]
    with jax.default_device(h200):
        text = jax.jit(fn).trace(*on_device(h200, *args)).lower().as_text()
    return text.count("xla.gpu.triton")


@pytest.mark.parametrize("causal", (True, False))
def test_step_features_lower_for_cuda(causal):
    """tanh, the scalar prefix per batch row and separate head dims (192 and 128, MLA's) go
    through Triton's lowering: one kernel forward, two backward."""
    q = jax.ShapeDtypeStruct((2, 256, 4, 192), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 256, 2, 192), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((2, 256, 2, 128), jnp.bfloat16)
    do = jax.ShapeDtypeStruct((2, 256, 4, 128), jnp.bfloat16)
    pos, seg = jax.ShapeDtypeStruct((256,), jnp.int32), jax.ShapeDtypeStruct((2, 256), jnp.int32)
    lse = jax.ShapeDtypeStruct((2, 4, 256), jnp.float32)
    kw = dict(causal=causal, softmax_scale=0.1, softcap=30.0, window=100)
    if causal:
        kw.update(bidirectional=True, prefix=jnp.asarray([64, 0], jnp.int32))

    def fwd(q, k, v, p, s):
        return pg.forward_step(q, k, v, p, p, s, s, **kw)

    def bwd(q, k, v, do, lse, delta, p, s):
        return pg.backward_step(q, k, v, do, lse, delta, p, p, s, s, **kw)

    assert _lowered_triton_calls(fwd, q, k, v, pos, seg) == 1
    assert _lowered_triton_calls(bwd, q, k, v, do, lse, lse, pos, seg) == 2


def test_feature_keywords_are_checked():
    q, k, v, _, q_pos, k_pos, q_seg, k_seg = _feature_inputs(FeatureCase(segments=True))
    kw = dict(softmax_scale=0.1, interpret=True)
    prefix = jnp.asarray([4, 0], jnp.int32)
    with pytest.raises(ValueError, match="prefix needs causal"):
        pg.forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, causal=False, prefix=prefix, **kw)
    with pytest.raises(ValueError, match="batch"):
        pg.forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, causal=True, prefix=prefix[:1], **kw)
    with pytest.raises(ValueError, match="segment ids"):
        pg.forward_step(q, k, v, q_pos, k_pos, None, None, causal=True, bidirectional=True, **kw)
    with pytest.raises(ValueError, match="softcap"):
        pg.forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, causal=True, softcap=0.0, **kw)
    with pytest.raises(ValueError, match="bad shapes"):  # v's own head dim, but not its own length
        pg.forward_step(q, k, v[:, :8, :, :16], q_pos, k_pos, q_seg, k_seg, causal=True, **kw)
