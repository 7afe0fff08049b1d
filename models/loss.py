"""Next-token cross-entropy, plain and chunked (never materialising [seq, vocab] logits).

The chunked loss walks each device's sequence shard in chunks of ``chunk`` tokens under
``jax.checkpoint``, so only one chunk's [batch, chunk, vocab] float32 logits exist at a time,
forward and backward (the blockwise idea of Liu & Abbeel 2023 applied to the output layer). The
sequence is viewed as [batch, sp * usp, shard] so that a chunk never crosses a device boundary of
the sequence axes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh

from models.sharding import constrain, seq_shards

F32 = jnp.float32


@jax.custom_vjp
def logits_f32(h: jax.Array, w: jax.Array) -> jax.Array:
    """float32 logits [..., V] of h [..., E] and w [E, V] (same dtype), accumulated in float32.

    The backward pass rounds the float32 cotangent to the input dtype first, so that a bf16 model's
    output-layer gradients are bf16 GEMMs rather than float32 ones (the mixed-precision convention).
    """
    return jnp.einsum("...e,ev->...v", h, w, preferred_element_type=F32)


def _logits_fwd(h, w):
    return logits_f32(h, w), (h, w)


def _logits_bwd(res, ct):
    h, w = res
    _, vjp = jax.vjp(lambda h, w: jnp.einsum("...e,ev->...v", h, w), h, w)
    return vjp(ct.astype(h.dtype))


logits_f32.defvjp(_logits_fwd, _logits_bwd)


def _token_losses(h, w, targets, soft_cap: float | None = None):
    """h [..., E], w [E, V], targets int [...] -> float32 loss per token [...] (of the logits
    ``soft_cap * tanh(logits / soft_cap)`` when given: Gemma 2's final soft cap)."""
    logits = logits_f32(h, w.astype(h.dtype))
    if soft_cap is not None:
        logits = soft_cap * jnp.tanh(logits / soft_cap)
    lse = jax.nn.logsumexp(logits, axis=-1)
    vocab = lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    target_logit = jnp.sum(jnp.where(vocab == targets[..., None], logits, 0.0), axis=-1)
    return lse - target_logit


def cross_entropy_sum(
    h: jax.Array, w: jax.Array, targets: jax.Array, mask: jax.Array, *, soft_cap: float | None = None
) -> tuple[jax.Array, jax.Array]:
    """Plain loss: h [B, S, E], w [E, V], targets [B, S], mask [B, S] -> (loss_sum, tokens) f32."""
    mask = mask.astype(F32)
    return jnp.sum(_token_losses(h, w, targets, soft_cap) * mask), jnp.sum(mask)


def chunked_cross_entropy_sum(
    h: jax.Array,
    w: jax.Array,
    targets: jax.Array,
    mask: jax.Array,
    chunk: int,
    *,
    mesh: Mesh | None = None,
    soft_cap: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Same as :func:`cross_entropy_sum`, one ``chunk`` of every sp shard at a time.

    ``chunk`` is clamped to the largest divisor of the per-device shard length.
    """
    B, S, E = h.shape
    n = seq_shards(mesh)
    if S % n:
        raise ValueError(f"sequence {S=} is not divisible by the sp * usp axis sizes {n}")
    local = S // n
    c = max(1, min(local, chunk))
    while local % c:
        c -= 1
    k = local // c
    w = constrain(w.astype(h.dtype), (None, "act_vocab"), mesh)  # gathered once, not per chunk
    view = lambda x: jnp.moveaxis(x.reshape(B, n, k, c, *x.shape[2:]), 2, 0)  # [k, B, n, c, ...]
    hs = view(h)  # [k, B, ring, chunk, E]
    ts, ms = view(targets), view(mask.astype(F32))  # [k, B, ring, chunk]

    @jax.checkpoint
    def one(h_c, t_c, m_c):
        h_c = constrain(h_c, ("act_batch", "act_seq", None, "act_embed"), mesh)
        return jnp.sum(_token_losses(h_c, w, t_c, soft_cap) * m_c)

    def body(total, xs):
        return total + one(*xs), None

    loss_sum, _ = lax.scan(body, jnp.zeros((), F32), (hs, ts, ms))
    return loss_sum, jnp.sum(ms)
