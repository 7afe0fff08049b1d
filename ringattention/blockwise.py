"""Pure-JAX blockwise attention for one ring step, and the blockwise feed-forward.

The ``"xla"`` implementation of a ring step (Blockwise Parallel Transformer, Liu & Abbeel 2023; the
online softmax of FlashAttention-2, Dao 2023): queries and keys are cut into chunks; for every query
chunk a ``lax.scan`` over key chunks keeps a float32 running max ``m``, denominator ``l`` and output
accumulator. Chunk pairs that the mask hides completely are skipped by ``lax.switch`` (not computed and
masked); pairs that are fully visible skip the elementwise mask. The backward pass recomputes scores
from the global lse. See ``implementations.py`` for the step contract.

Optional features (all of ``implementations.FEATURES``): logit soft-capping ``softcap=C``, scores
``C tanh(s / C)`` before masking (Gemma 2, Gemma Team 2024), whose backward multiplies ``ds`` by
``1 - tanh^2``; a bidirectional ``prefix`` per row and bidirectional (negative-id) segments
(``masks.visible``); and a value head dim Dv other than q/k's D (MLA shapes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from ringattention import masks
from ringattention._vma import full_like

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Chunk sizes of the XLA inner loop; each is clamped to the shard (largest divisor <= request)."""

    q_chunk: int = 2048  # tuned on an H200: benchmarks/results/xla_chunk_sweep_h200.md
    kv_chunk: int = 2048


def _chunk(length: int, request: int) -> int:
    c = max(1, min(length, request))
    while length % c:
        c -= 1
    return c


def _combined_table(
    q_pos, k_pos, q_seg, k_seg, causal, cq, ck, window=None, prefix=None, bidirectional=False
):
    # A chunk pair covers the whole batch: skip only if every sequence skips, FULL only if all are.
    t = masks.block_table(
        q_pos, k_pos, q_seg, k_seg, causal, cq, ck, window, prefix, bidirectional
    )  # [B|1, nq, nk]
    full = jnp.all(t == masks.FULL, axis=0)
    any_ = jnp.any(t != masks.SKIP, axis=0)
    return jnp.where(full, masks.FULL, jnp.where(any_, masks.PARTIAL, masks.SKIP))  # [nq, nk]


def _split(x, n: int, axis: int):
    # [..., n*c, ...] -> [n, ..., c, ...] (chunk index first, for lax.scan)
    shape = x.shape[:axis] + (n, x.shape[axis] // n) + x.shape[axis + 1 :]
    return jnp.moveaxis(x.reshape(shape), axis, 0)


def _scores(q_blk, k_blk, scale, softcap=None):
    # q_blk [B, cq, K, G, D], k_blk [B, ck, K, D] -> float32 [B, K, G, cq, ck]
    s = jnp.einsum("bqhgd,bkhd->bhgqk", q_blk, k_blk, preferred_element_type=F32) * scale
    return s if softcap is None else softcap * jnp.tanh(s / softcap)


def _mask(qp, kp, qs, ks, causal, window=None, prefix=None, bidirectional=False):
    # -> bool [B|1, 1, 1, cq, ck]
    return masks.visible(qp, kp, qs, ks, causal, window, prefix, bidirectional)[:, None, None]


def forward_step(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_pos: jax.Array,
    k_pos: jax.Array,
    q_seg: jax.Array | None,
    k_seg: jax.Array | None,
    *,
    causal: bool,
    softmax_scale: float,
    block_sizes: BlockSizes | None = None,
    interpret: bool = False,
    window: int | None = None,
    softcap: float | None = None,
    prefix: jax.Array | None = None,
    bidirectional: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """One ring step forward (contract in ``implementations.py``). Returns (o f32, lse f32)."""
    del interpret
    bs = block_sizes or BlockSizes()
    B, Sq, H, D = q.shape  # [batch, q_shard, heads, head_dim]
    Sk, K = k.shape[1], k.shape[2]  # k: [batch, kv_shard, kv_heads, head_dim]
    Dv = v.shape[3]  # v: [batch, kv_shard, kv_heads, v_head_dim]
    G = H // K
    cq, ck = _chunk(Sq, bs.q_chunk), _chunk(Sk, bs.kv_chunk)
    nq, nk = Sq // cq, Sk // ck
    mask_kw = dict(window=window, prefix=prefix, bidirectional=bidirectional)
    table = _combined_table(q_pos, k_pos, q_seg, k_seg, causal, cq, ck, **mask_kw)  # [nq, nk]
    qc = _split(q.reshape(B, Sq, K, G, D), nq, 1)  # [nq, B, cq, K, G, D]
    kc, vc = _split(k, nk, 1), _split(v, nk, 1)  # [nk, B, ck, K, D]
    qpc, kpc = q_pos.reshape(nq, cq), k_pos.reshape(nk, ck)
    qsc = None if q_seg is None else _split(q_seg, nq, 1)  # [nq, B, cq]
    ksc = None if k_seg is None else _split(k_seg, nk, 1)  # [nk, B, ck]

    def kv_body(q_blk, qp, qs, carry, xs):
        acc, m, l = carry  # [B, K, G, cq, Dv], [B, K, G, cq], [B, K, G, cq]
        kind, k_blk, v_blk, kp, ks = xs

        def update(masked):
            s = _scores(q_blk, k_blk, softmax_scale, softcap)  # [B, K, G, cq, ck]
            if masked:
                s = jnp.where(_mask(qp, kp, qs, ks, causal, **mask_kw), s, -jnp.inf)
            m_new = jnp.maximum(m, s.max(-1))
            m_safe = jnp.where(jnp.isneginf(m_new), 0.0, m_new)
            p = jnp.exp(s - m_safe[..., None])
            corr = jnp.exp(m - m_safe)
            pv = jnp.einsum("bhgqk,bkhd->bhgqd", p.astype(v_blk.dtype), v_blk, preferred_element_type=F32)
            return acc * corr[..., None] + pv, m_new, l * corr + p.sum(-1)

        branches = [lambda: (acc, m, l), lambda: update(True), lambda: update(False)]
        return lax.switch(kind, branches), None

    def q_body(_, xs):
        kinds, q_blk, qp, qs = xs
        init = (
            full_like(q_blk, (B, K, G, cq, Dv), 0.0),
            full_like(q_blk, (B, K, G, cq), -jnp.inf),
            full_like(q_blk, (B, K, G, cq), 0.0),
        )
        body = lambda c, ys: kv_body(q_blk, qp, qs, c, ys)  # noqa: E731
        (acc, m, l), _ = lax.scan(body, init, (kinds, kc, vc, kpc, ksc))
        seen = l > 0
        o = acc / jnp.where(seen, l, 1.0)[..., None]
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf)
        return None, (o, lse)

    _, (o, lse) = lax.scan(q_body, None, (table, qc, qpc, qsc))  # [nq, B, K, G, cq, (D)]
    o = jnp.moveaxis(o, 0, 3).reshape(B, K, G, Sq, Dv)
    o = o.transpose(0, 3, 1, 2, 4).reshape(B, Sq, H, Dv)
    lse = jnp.moveaxis(lse, 0, 3).reshape(B, H, Sq)
    return o, lse


def backward_step(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    do: jax.Array,
    lse: jax.Array,
    delta: jax.Array,
    q_pos: jax.Array,
    k_pos: jax.Array,
    q_seg: jax.Array | None,
    k_seg: jax.Array | None,
    *,
    causal: bool,
    softmax_scale: float,
    block_sizes: BlockSizes | None = None,
    interpret: bool = False,
    window: int | None = None,
    softcap: float | None = None,
    prefix: jax.Array | None = None,
    bidirectional: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One ring step backward (contract in ``implementations.py``). Returns float32 dq, dk, dv."""
    del interpret
    bs = block_sizes or BlockSizes()
    B, Sq, H, D = q.shape
    Sk, K, Dv = k.shape[1], k.shape[2], v.shape[3]
    G = H // K
    cq, ck = _chunk(Sq, bs.q_chunk), _chunk(Sk, bs.kv_chunk)
    nq, nk = Sq // cq, Sk // ck
    mask_kw = dict(window=window, prefix=prefix, bidirectional=bidirectional)
    table = _combined_table(q_pos, k_pos, q_seg, k_seg, causal, cq, ck, **mask_kw).T  # [nk, nq]
    qc = _split(q.reshape(B, Sq, K, G, D), nq, 1)  # [nq, B, cq, K, G, D]
    doc = _split(do.reshape(B, Sq, K, G, Dv), nq, 1)  # [nq, B, cq, K, G, Dv]
    lse_safe = jnp.where(jnp.isneginf(lse), 0.0, lse)
    lsec = _split(lse_safe.reshape(B, K, G, Sq), nq, 3)  # [nq, B, K, G, cq]
    deltac = _split(delta.reshape(B, K, G, Sq), nq, 3)  # [nq, B, K, G, cq]
    kc, vc = _split(k, nk, 1), _split(v, nk, 1)  # [nk, B, ck, K, D | Dv]
    qpc, kpc = q_pos.reshape(nq, cq), k_pos.reshape(nk, ck)
    qsc = None if q_seg is None else _split(q_seg, nq, 1)
    ksc = None if k_seg is None else _split(k_seg, nk, 1)

    def q_body(k_blk, v_blk, kp, ks, carry, xs):
        dk, dv = carry  # [B, ck, K, D], [B, ck, K, Dv] float32
        kind, q_blk, do_blk, lse_blk, delta_blk, qp, qs, dq_blk = xs

        def update(masked):
            s = _scores(q_blk, k_blk, softmax_scale, softcap)  # [B, K, G, cq, ck]
            p = jnp.exp(s - lse_blk[..., None])
            if masked:
                p = jnp.where(_mask(qp, kp, qs, ks, causal, **mask_kw), p, 0.0)
            dv_new = dv + jnp.einsum(
                "bhgqk,bqhgd->bkhd", p.astype(do_blk.dtype), do_blk, preferred_element_type=F32
            )
            dp = jnp.einsum("bqhgd,bkhd->bhgqk", do_blk, v_blk, preferred_element_type=F32)
            ds = p * (dp - delta_blk[..., None]) * softmax_scale
            if softcap is not None:  # d(C tanh(x / C)) / dx = 1 - (s / C)^2
                ds = ds * (1.0 - jnp.square(s / softcap))
            ds = ds.astype(q_blk.dtype)
            dq_new = dq_blk + jnp.einsum("bhgqk,bkhd->bqhgd", ds, k_blk, preferred_element_type=F32)
            dk_new = dk + jnp.einsum("bhgqk,bqhgd->bkhd", ds, q_blk, preferred_element_type=F32)
            return (dk_new, dv_new), dq_new

        branches = [lambda: ((dk, dv), dq_blk), lambda: update(True), lambda: update(False)]
        return lax.switch(kind, branches)

    def kv_body(dq_all, xs):
        kinds, k_blk, v_blk, kp, ks = xs
        init = (full_like(q, (B, ck, K, D), 0.0), full_like(q, (B, ck, K, Dv), 0.0))
        body = lambda c, ys: q_body(k_blk, v_blk, kp, ks, c, ys)  # noqa: E731
        (dk, dv), dq_all = lax.scan(body, init, (kinds, qc, doc, lsec, deltac, qpc, qsc, dq_all))
        return dq_all, (dk, dv)

    dq0 = full_like(q, (nq, B, cq, K, G, D), 0.0)
    dq, (dk, dv) = lax.scan(kv_body, dq0, (table, kc, vc, kpc, ksc))
    dq = jnp.moveaxis(dq, 0, 1).reshape(B, Sq, H, D)
    dk = jnp.moveaxis(dk, 0, 1).reshape(B, Sk, K, D)
    dv = jnp.moveaxis(dv, 0, 1).reshape(B, Sk, K, Dv)
    return dq, dk, dv


def blockwise_feedforward(fn: Callable, x: jax.Array, chunk_size: int, axis: int = 1) -> jax.Array:
    """Applies ``fn`` to ``x`` chunk by chunk along ``axis`` under ``jax.checkpoint`` (BPT).

    ``fn`` maps an array shaped like ``x`` with ``chunk_size`` along ``axis`` to one of the same length
    along that axis (e.g. a position-wise MLP). Activations inside ``fn`` then live for one chunk at a
    time, forward and backward: memory O(chunk_size) instead of O(seq). ``x.shape[axis]`` must be a
    multiple of ``chunk_size``.
    """
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{chunk_size=} must be a positive int")
    length = x.shape[axis]
    if length % chunk_size:
        raise ValueError(f"{x.shape=} along {axis=} is not a multiple of {chunk_size=}")
    n = length // chunk_size
    if n == 1:
        return jax.checkpoint(fn)(x)
    xs = _split(x, n, axis)  # [n, ..., chunk, ...]
    ys = lax.map(jax.checkpoint(fn), xs)
    ys = jnp.moveaxis(ys, 0, axis)
    return ys.reshape(ys.shape[:axis] + (length,) + ys.shape[axis + 2 :])
