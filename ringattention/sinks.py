"""Attention sinks: one learned logit per query head in the softmax denominator, with no value.

gpt-oss (OpenAI, gpt-oss-120b & gpt-oss-20b model card, 2025) adds to every head's softmax an extra
logit ``sink[h]`` that takes probability mass but contributes nothing to the output, so a query can
attend "nowhere" (the learned form of StreamingLLM's sink token, Xiao et al. 2023). The sink is a
term of the softmax denominator only, so the ring steps never see it: after the forward lap the
ring merges it once into the float32 log-sum-exp,

    lse_total = logaddexp(lse, sink[h]),   o = o * exp(lse - lse_total)

(rows that see no key: o = 0, lse_total = sink). The backward lap then runs with ``lse_total`` and
``delta = rowsum(o * do)`` of the final output, which is already the exact gradient for q, k, v; the
sink's own gradient is ``dsink[h] = -sum_{b, s} exp(sink[h] - lse_total) * delta``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

F32 = jnp.float32


def merge(o: jax.Array, lse: jax.Array, sinks: jax.Array) -> tuple[jax.Array, jax.Array]:
    """o float32 [B, S, H, Dv], lse float32 [B, H, S] (-inf: no key), sinks [H] -> (o, lse_total)."""
    sink = sinks.astype(F32)[None, :, None]  # [1, H, 1]
    total = jnp.logaddexp(lse, sink)  # [B, H, S]; finite where the sink is
    scale = jnp.exp(lse - total)  # 0 where lse is -inf
    o = o * jnp.swapaxes(scale, 1, 2)[..., None]  # [B, S, H, Dv]
    return o, total


def grad(sinks: jax.Array, lse_total: jax.Array, delta: jax.Array) -> jax.Array:
    """dsinks [H] in sinks' dtype from lse_total and delta = rowsum(o * do), both float32 [B, H, S]."""
    p_sink = jnp.exp(sinks.astype(F32)[None, :, None] - lse_total)  # [B, H, S]
    return (-(p_sink * delta).sum((0, 2))).astype(sinks.dtype)
