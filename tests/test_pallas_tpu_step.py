"""Pallas TPU ring step (``implementation="pallas_tpu"``) in interpret mode on CPU, kernel-level: one
step against a float64 step in TPU interpret mode (``pltpu.InterpretParams``: uninitialised VMEM is
NaN, out-of-bounds reads raise), with random global offsets and a step in which every block is
skipped; the optional step features (soft cap, bidirectional prefix, bidirectional segments, v head
dim) alone and together. What the pallas_tpu tests share: tpu_cases.py.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from ringcheck import F32_RTOL, rel_err
from tpu_cases import SMALL, TPU_INTERPRET

from ringattention import masks
from ringattention.kernels.tpu import pallas_tpu


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
