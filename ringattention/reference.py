"""Naive attention over a whole sequence: the reference every path is checked against.

Materialises the [heads, q_len, kv_len] score matrix, so it is only for tests, small inputs and users'
own checks. Same masking semantics as ``ring_attention`` (causal on global positions, segment ids,
sliding window, GQA).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from einops import rearrange

from ringattention import _validate as checks
from ringattention import masks


def reference_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    q_positions: jax.Array | None = None,
    kv_positions: jax.Array | None = None,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
    sinks: jax.Array | None = None,
    logits_soft_cap: float | None = None,
    prefix_length: jax.Array | int | None = None,
    bidirectional_segments: bool = False,
) -> jax.Array:
    """Naive attention. q [B, Sq, H, D], k [B, Sk, K, D], v [B, Sk, K, Dv] with H % K == 0 ->
    [B, Sq, H, Dv].

    Computed in float32 (or q's dtype if wider). ``segment_ids`` [B, Sq] (``kv_segment_ids`` [B, Sk]
    defaults to it); positions [Sq] / [Sk] default to ``arange``. ``sliding_window`` W: a key is
    visible only if ``|q_pos - kv_pos| < W``. ``sinks`` [H]: a logit per query head in the softmax
    denominator with no value (gpt-oss). ``logits_soft_cap`` C: scores ``C tanh(s / C)`` (Gemma 2).
    ``prefix_length`` int [B] (or an int) with causal: keys at positions below it are visible to
    every query of the row; ``bidirectional_segments``: negative segment ids are bidirectional.
    Rows that see no key (and no sink) give 0.
    """
    B, Sq, H, D = q.shape
    Sk, K = k.shape[1], k.shape[2]
    if H % K:
        raise ValueError(f"query heads must be a multiple of kv heads; got {q.shape=} {k.shape=}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must agree in batch, length and kv heads; got {k.shape=} {v.shape=}")
    causal = checks.causal(causal)
    checks.segment_ids(segment_ids, (B, Sq))
    if segment_ids is not None:
        checks.segment_ids(kv_segment_ids, (B, Sk), "kv_segment_ids")
    elif kv_segment_ids is not None:
        raise ValueError("kv_segment_ids needs segment_ids (the queries' ids)")
    sliding_window = checks.sliding_window(sliding_window)
    softmax_scale = checks.softmax_scale(softmax_scale)
    checks.sinks(sinks, H)
    cap = checks.logits_soft_cap(logits_soft_cap)
    prefix = checks.prefix_length(prefix_length, B, causal)
    bidirectional = checks.bidirectional_segments(bidirectional_segments, causal, segment_ids)
    dtype = jnp.promote_types(q.dtype, jnp.float32)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    qg = rearrange(q.astype(dtype), "b s (k g) d -> b s k g d", k=K)  # g: query heads per kv head
    s = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k.astype(dtype)) * scale  # [B, K, G, Sq, Sk]
    if cap is not None:
        s = cap * jnp.tanh(s / cap)
    qp = jnp.arange(Sq) if q_positions is None else q_positions
    kp = jnp.arange(Sk) if kv_positions is None else kv_positions
    ks = None if segment_ids is None else (segment_ids if kv_segment_ids is None else kv_segment_ids)
    mask = masks.visible(
        qp, kp, segment_ids, ks, causal, sliding_window, prefix, bidirectional
    )  # [B|1, Sq, Sk]
    s = jnp.where(mask[:, None, None], s, -jnp.inf)
    m = jnp.max(s, -1, keepdims=True)  # [B, K, G, Sq, 1]
    if sinks is not None:  # the sink joins the max and the denominator, not the values
        sink = rearrange(sinks.astype(dtype), "(k g) -> k g", k=K)[None, :, :, None, None]
        m = jnp.maximum(m, sink)
    p = jnp.exp(s - jnp.where(jnp.isneginf(m), 0.0, m))
    l = p.sum(-1, keepdims=True)
    if sinks is not None:
        l = l + jnp.exp(sink - m)
    p = p / jnp.where(l > 0, l, 1.0)
    o = jnp.einsum("bhgqk,bkhd->bqhgd", p, v.astype(dtype))
    return rearrange(o, "b s k g d -> b s (k g) d").astype(q.dtype)
