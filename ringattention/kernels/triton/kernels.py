"""Kernel bodies of the Pallas (Triton) GPU ring step: forward, dq and dk/dv.

FlashAttention-2 (Dao 2023) tiling in the log2 domain: logits are scaled by ``softmax_scale *
log2(e)`` so every exponential is an ``exp2``; the carried running max ``m``, denominator ``l`` and
accumulators are float32. Each kernel walks its key (or query) blocks in two phases given by
per-block bounds that the wrapper derives from ``masks.block_table``: ``[lo, mid)`` blocks are
fully visible and run without a mask, ``[mid, hi)`` are partially visible and run with the
elementwise causal / segment mask; blocks outside ``[lo, hi)`` are hidden and never loaded. With a
sliding window a fourth bound ``edge`` splits off the blocks at the window's far edge: ``[lo, edge)``
masked, ``[edge, mid)`` unmasked, ``[mid, hi)`` masked (``edge_ref`` is None without a window). Shapes
in comments: ``bq``/``bk`` block lengths, ``D`` the (padded) head dim of q/k and ``Dv`` of v,
``Sq``/``Sk`` the (padded) shard lengths, ``G`` query heads per kv head.

Optional features (``implementations.py``), each static and off by default, when the kernels and
their lowering are those without it: ``softcap`` (logits ``C * tanh(logit / C)``; the backward
multiplies ``ds`` by ``1 - t**2``), ``pf_ref`` (a bidirectional prefix per batch row, read as a
scalar by the program's batch index; None without) and ``bidirectional`` (queries of negative
segments see their whole segment).
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

F32 = jnp.float32
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


def _dot_nt(a, b, precision):
    # a [m, k], b [n, k] -> float32 [m, n]
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())), precision=precision, preferred_element_type=F32)


def _dot_nn(a, b, precision):
    # a [m, k], b [k, n] -> float32 [m, n]
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), precision=precision, preferred_element_type=F32)


def _visible(
    q_pos,
    k_pos,
    q_seg,
    k_seg,
    keys_first: bool = False,
    causal: bool = True,
    window: int | None = None,
    prefix=None,
    bidirectional: bool = False,
):
    """bool [bq, bk] ([bk, bq] if ``keys_first``); each argument a loaded vector or None. Positions
    (when given) mask causally unless ``causal`` is False, and by ``|q - k| < window``. As
    ``masks.visible``: ``prefix`` (a loaded scalar or None) makes keys before it visible, and
    ``bidirectional`` makes queries of negative segments see their whole segment (both only when
    causal)."""
    rows, cols = (slice(None), None), (None, slice(None))
    qi, ki = (cols, rows) if keys_first else (rows, cols)
    vis = None
    if q_pos is not None and causal:
        vis = k_pos[ki] <= q_pos[qi]
        if prefix is not None:
            vis = vis | (k_pos[ki] < prefix)
        if bidirectional:
            vis = vis | (q_seg[qi] < 0)
    if window is not None:
        d = q_pos[qi] - k_pos[ki]
        one_sided = causal and prefix is None and not bidirectional  # causal covers d < 0
        near = d < window if one_sided else (d < window) & (-d < window)
        vis = near if vis is None else vis & near
    if q_seg is not None:
        same = q_seg[qi] == k_seg[ki]
        vis = same if vis is None else vis & same
    return vis


def _logits(a, b, qk_scale: float, precision, softcap: float | None):
    """Scaled logits of a [m, D] and b [n, D] in log2 units, float32 [m, n], and with ``softcap``
    the tanh of the capped ones (for the backward's ``1 - t**2``), else None."""
    s = _dot_nt(a, b, precision)
    if softcap is None:
        return s * qk_scale, None
    t = jnp.tanh(s * (qk_scale / (LOG2E * softcap)))  # qk_scale / LOG2E: softmax_scale
    return t * (softcap * LOG2E), t


def _capped(ds, t):
    """ds [m, n] through the soft cap's derivative ``1 - t**2`` (t None: no cap)."""
    return ds if t is None else ds * (1.0 - t * t)


def _load(ref, idx):
    return None if ref is None else ref[idx]


def _loops(bounds, body, carry, masked: bool):
    """Runs ``body(j, carry, masked=...)`` over [lo, edge) masked (window edge, if any), [edge or lo,
    mid) unmasked and [mid, hi) masked. bounds: (lo, mid, hi, edge | None), loaded scalars."""
    lo, mid, hi, edge = bounds
    if edge is not None:
        carry = lax.fori_loop(lo, edge, functools.partial(body, masked=True), carry)
        lo = edge
    carry = lax.fori_loop(lo, mid, functools.partial(body, masked=False), carry)
    return lax.fori_loop(mid, hi, functools.partial(body, masked=masked), carry)


def fwd_kernel(
    lo_ref,
    mid_ref,
    hi_ref,
    edge_ref,
    q_ref,
    k_ref,
    v_ref,
    qp_ref,
    kp_ref,
    qs_ref,
    ks_ref,
    pf_ref,
    o_ref,
    lse_ref,
    *,
    qk_scale: float,
    block_k: int,
    precision,
    causal: bool = True,
    window: int | None = None,
    softcap: float | None = None,
    bidirectional: bool = False,
):
    """One (query block, batch, head): o and lse over the key blocks of this ring step.

    lo/mid/hi/edge_ref: scalar block bounds (edge: None without a window); q_ref [bq, D]; k_ref
    [Sk, D]; v_ref [Sk, Dv]; qp_ref [bq] | None; kp_ref [Sk] | None; qs_ref [bq] | None; ks_ref
    [Sk] | None; pf_ref: scalar prefix of the batch row | None; o_ref f32 [bq, Dv]; lse_ref f32
    [bq]. ``softcap``: logits ``C * tanh(logit / C)``, masked after capping.
    """
    bq, dv = o_ref.shape
    q = q_ref[...]  # [bq, D]
    q_pos, q_seg = _load(qp_ref, ...), _load(qs_ref, ...)  # [bq] | None
    mask = dict(causal=causal, window=window, prefix=_load(pf_ref, ...), bidirectional=bidirectional)

    def body(j, carry, masked):
        acc, m, l = carry  # [bq, Dv], [bq], [bq] float32; m in log2 units
        kv = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
        s, _ = _logits(q, k_ref[kv, :], qk_scale, precision, softcap)  # [bq, bk]
        if masked:
            vis = _visible(q_pos, _load(kp_ref, kv), q_seg, _load(ks_ref, kv), **mask)
            s = jnp.where(vis, s, -jnp.inf)
        m_new = jnp.maximum(m, s.max(axis=-1))
        m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) if masked else m_new
        p = jnp.exp2(s - m_use[:, None])  # [bq, bk]
        corr = jnp.exp2(m - m_use)  # [bq]
        pv = _dot_nn(p.astype(v_ref.dtype), v_ref[kv, :], precision)  # [bq, Dv]
        return acc * corr[:, None] + pv, m_new, l * corr + p.sum(axis=-1)

    carry = (jnp.zeros((bq, dv), F32), jnp.full((bq,), -jnp.inf, F32), jnp.zeros((bq,), F32))
    bounds = (lo_ref[...], mid_ref[...], hi_ref[...], _load(edge_ref, ...))
    acc, m, l = _loops(bounds, body, carry, qp_ref is not None or qs_ref is not None)
    seen = l > 0.0
    l_safe = jnp.where(seen, l, 1.0)
    o_ref[...] = acc / l_safe[:, None]  # rows that see no key: 0
    lse_ref[...] = jnp.where(seen, (m + jnp.log2(l_safe)) * LN2, -jnp.inf)


def dq_kernel(
    lo_ref,
    mid_ref,
    hi_ref,
    edge_ref,
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    qp_ref,
    kp_ref,
    qs_ref,
    ks_ref,
    pf_ref,
    dq_ref,
    *,
    qk_scale: float,
    scale: float,
    block_k: int,
    precision,
    causal: bool = True,
    window: int | None = None,
    softcap: float | None = None,
    bidirectional: bool = False,
):
    """One (query block, batch, head): dq over the key blocks of this ring step.

    q_ref [bq, D]; do_ref [bq, Dv]; k_ref [Sk, D]; v_ref [Sk, Dv]; lse_ref [bq] global lse in log2
    units (0 where none is seen); delta_ref [bq]; positions / segments / prefix as in
    ``fwd_kernel``; dq_ref f32 [bq, D].
    """
    q, do = q_ref[...], do_ref[...]  # [bq, D], [bq, Dv]
    lse, delta = lse_ref[...], delta_ref[...]  # [bq]
    q_pos, q_seg = _load(qp_ref, ...), _load(qs_ref, ...)
    mask = dict(causal=causal, window=window, prefix=_load(pf_ref, ...), bidirectional=bidirectional)

    def body(j, dq, masked):
        kv = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
        k = k_ref[kv, :]  # [bk, D]
        s, t = _logits(q, k, qk_scale, precision, softcap)  # [bq, bk]
        p = jnp.exp2(s - lse[:, None])  # [bq, bk]
        if masked:
            vis = _visible(q_pos, _load(kp_ref, kv), q_seg, _load(ks_ref, kv), **mask)
            p = jnp.where(vis, p, 0.0)
        dp = _dot_nt(do, v_ref[kv, :], precision)  # [bq, bk]
        ds = _capped(p * (dp - delta[:, None]), t)
        return dq + _dot_nn(ds.astype(k.dtype), k, precision)

    dq = jnp.zeros(q.shape, F32)
    bounds = (lo_ref[...], mid_ref[...], hi_ref[...], _load(edge_ref, ...))
    dq = _loops(bounds, body, dq, qp_ref is not None or qs_ref is not None)
    dq_ref[...] = dq * scale


def dkv_kernel(
    lo_ref,
    mid_ref,
    hi_ref,
    edge_ref,
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    qp_ref,
    kp_ref,
    qs_ref,
    ks_ref,
    pf_ref,
    dk_ref,
    dv_ref,
    *,
    qk_scale: float,
    scale: float,
    block_q: int,
    groups: int,
    precision,
    causal: bool = True,
    window: int | None = None,
    softcap: float | None = None,
    bidirectional: bool = False,
    unrolled_groups: bool = False,
):
    """One (key block, batch, kv head): dk, dv summed over the group's query heads and blocks.

    k_ref [bk, D]; v_ref [bk, Dv]; q_ref [Sq, G, D]; do_ref [Sq, G, Dv]; lse_ref, delta_ref [G, Sq];
    qp_ref [Sq] | None; kp_ref [bk] | None; qs_ref [Sq] | None; ks_ref [bk] | None; pf_ref: scalar
    prefix | None; dk_ref f32 [bk, D]; dv_ref f32 [bk, Dv].
    Works transposed (keys as rows) so every product is a plain or B-transposed matmul.
    """
    k, v = k_ref[...], v_ref[...]  # [bk, D], [bk, Dv]
    k_pos, k_seg = _load(kp_ref, ...), _load(ks_ref, ...)  # [bk] | None
    mask = dict(causal=causal, window=window, prefix=_load(pf_ref, ...), bidirectional=bidirectional)

    def body(i, carry, g, masked):
        dk, dv = carry  # [bk, D], [bk, Dv] float32
        qb = pl.ds(pl.multiple_of(i * block_q, block_q), block_q)
        q, do = q_ref[qb, g, :], do_ref[qb, g, :]  # [bq, D], [bq, Dv]
        lse, delta = lse_ref[g, qb], delta_ref[g, qb]  # [bq]
        s_t, t_t = _logits(k, q, qk_scale, precision, softcap)  # [bk, bq]
        p_t = jnp.exp2(s_t - lse[None, :])  # [bk, bq]
        if masked:
            vis_t = _visible(_load(qp_ref, qb), k_pos, _load(qs_ref, qb), k_seg, keys_first=True, **mask)
            p_t = jnp.where(vis_t, p_t, 0.0)
        dv = dv + _dot_nn(p_t.astype(do.dtype), do, precision)
        dp_t = _dot_nt(v, do, precision)  # [bk, bq]
        ds_t = _capped(p_t * (dp_t - delta[None, :]), t_t)
        return dk + _dot_nn(ds_t.astype(q.dtype), q, precision), dv

    bounds = (lo_ref[...], mid_ref[...], hi_ref[...], _load(edge_ref, ...))
    masked = qp_ref is not None or qs_ref is not None

    def head(g, carry):
        return _loops(bounds, functools.partial(body, g=g), carry, masked)

    zeros = jnp.zeros(k.shape, F32)
    zeros_v = zeros if v.shape == k.shape else jnp.zeros(v.shape, F32)
    if groups == 1 or unrolled_groups:  # unrolled: Pallas' interpreter under check_vma (below)
        dk, dv = zeros, zeros_v
        for g in range(groups):
            dk, dv = head(g, (dk, dv))
    else:
        dk, dv = lax.fori_loop(0, groups, head, (zeros, zeros_v))
    dk_ref[...] = dk * scale
    dv_ref[...] = dv
