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


def reference_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = False,
                        segment_ids: jax.Array | None = None,
                        kv_segment_ids: jax.Array | None = None,
                        q_positions: jax.Array | None = None,
                        kv_positions: jax.Array | None = None,
                        softmax_scale: float | None = None,
                        sliding_window: int | None = None) -> jax.Array:
    """Naive attention. q [B, Sq, H, D], k/v [B, Sk, K, D] with H % K == 0 -> [B, Sq, H, D].

    Computed in float32 (or q's dtype if wider). ``segment_ids`` [B, Sq] (``kv_segment_ids`` [B, Sk]
    defaults to it); positions [Sq] / [Sk] default to ``arange``. ``sliding_window`` W: a key is
    visible only if ``|q_pos - kv_pos| < W``. Rows that see no key give 0.
    """
    B, Sq, H, D = q.shape
    Sk, K = k.shape[1], k.shape[2]
    if H % K:
        raise ValueError(f"query heads must be a multiple of kv heads; got {q.shape=} {k.shape=}")
    causal = checks.causal(causal)
    checks.segment_ids(segment_ids, (B, Sq))
    if segment_ids is not None:
        checks.segment_ids(kv_segment_ids, (B, Sk), "kv_segment_ids")
    elif kv_segment_ids is not None:
        raise ValueError("kv_segment_ids needs segment_ids (the queries' ids)")
    sliding_window = checks.sliding_window(sliding_window)
    softmax_scale = checks.softmax_scale(softmax_scale)
    dtype = jnp.promote_types(q.dtype, jnp.float32)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    qg = rearrange(q.astype(dtype), "b s (k g) d -> b s k g d", k=K)  # g: query heads per kv head
    s = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k.astype(dtype)) * scale  # [B, K, G, Sq, Sk]
    qp = jnp.arange(Sq) if q_positions is None else q_positions
    kp = jnp.arange(Sk) if kv_positions is None else kv_positions
    mask = masks.visible(qp, kp, None, None, causal, sliding_window)  # [1, Sq, Sk]
    if segment_ids is not None:
        ks = segment_ids if kv_segment_ids is None else kv_segment_ids
        mask = mask & (segment_ids[:, :, None] == ks[:, None, :])
    s = jnp.where(mask[:, None, None], s, -jnp.inf)
    m = jnp.max(s, -1, keepdims=True)
    p = jnp.exp(s - jnp.where(jnp.isneginf(m), 0.0, m))
    l = p.sum(-1, keepdims=True)
    p = p / jnp.where(l > 0, l, 1.0)
    o = jnp.einsum("bhgqk,bkhd->bqhgd", p, v.astype(dtype))
    return rearrange(o, "b s k g d -> b s (k g) d").astype(q.dtype)
