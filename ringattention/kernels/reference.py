"""Naive float32 ring steps (the step contract of ``implementations.py``, optional features
included) that the Triton and Hopper kernels are tested against: whole [Sq, Sk] logits, the mask of
``masks.visible``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ringattention import masks

F32 = jnp.float32
HP = dict(precision=lax.Precision.HIGHEST, preferred_element_type=F32)


def _logits(
    q, k, q_pos, k_pos, q_seg, k_seg, *, causal, softmax_scale, window, softcap, prefix, bidirectional
):
    """Masked logits float32 [B, K, G, Sq, Sk] (-inf where hidden) and, with ``softcap``, the
    tanh of the capped ones (else None). q [B, Sq, H, D], k [B, Sk, K, D]."""
    B, Sq, H, D = q.shape
    K = k.shape[2]
    qg = q.astype(F32).reshape(B, Sq, K, H // K, D)
    s = jnp.einsum("bqkgd,bskd->bkgqs", qg, k.astype(F32), **HP) * softmax_scale
    t = None
    if softcap is not None:
        t = jnp.tanh(s / softcap)
        s = softcap * t
    vis = masks.visible(
        q_pos, k_pos, q_seg, k_seg, causal, window, prefix=prefix, bidirectional=bidirectional
    )[:, None, None]  # [B|1, 1, 1, Sq, Sk]
    return jnp.where(vis, s, -jnp.inf), t


def reference_forward_step(
    q,
    k,
    v,
    q_pos,
    k_pos,
    q_seg,
    k_seg,
    *,
    causal: bool,
    softmax_scale: float,
    window: int | None = None,
    softcap: float | None = None,
    prefix=None,
    bidirectional: bool = False,
):
    """Naive float32 forward of one step (same contract): (o [B, Sq, H, Dv], lse [B, H, Sq])."""
    B, Sq, H, _ = q.shape
    s, _ = _logits(
        q,
        k,
        q_pos,
        k_pos,
        q_seg,
        k_seg,
        causal=causal,
        softmax_scale=softmax_scale,
        window=window,
        softcap=softcap,
        prefix=prefix,
        bidirectional=bidirectional,
    )
    lse = jax.nn.logsumexp(s, axis=-1)  # [B, K, G, Sq], -inf where nothing is seen
    p = jnp.exp(s - jnp.where(jnp.isneginf(lse), 0.0, lse)[..., None])
    o = jnp.einsum("bkgqs,bskd->bqkgd", p, v.astype(F32), precision=lax.Precision.HIGHEST)
    return o.reshape(B, Sq, H, v.shape[3]), lse.reshape(B, H, Sq)


def reference_backward_step(
    q,
    k,
    v,
    do,
    lse,
    delta,
    q_pos,
    k_pos,
    q_seg,
    k_seg,
    *,
    causal: bool,
    softmax_scale: float,
    window: int | None = None,
    softcap: float | None = None,
    prefix=None,
    bidirectional: bool = False,
):
    """Naive float32 backward of one step (same contract): dq, dk, dv."""
    B, Sq, H, D = q.shape
    K, G = k.shape[2], H // k.shape[2]
    s, t = _logits(
        q,
        k,
        q_pos,
        k_pos,
        q_seg,
        k_seg,
        causal=causal,
        softmax_scale=softmax_scale,
        window=window,
        softcap=softcap,
        prefix=prefix,
        bidirectional=bidirectional,
    )
    qg, dog = q.astype(F32).reshape(B, Sq, K, G, D), do.astype(F32).reshape(B, Sq, K, G, -1)
    lse_safe = jnp.where(jnp.isneginf(lse), 0.0, lse).reshape(B, K, G, Sq)
    p = jnp.exp(s - lse_safe[..., None])  # [B, K, G, Sq, Sk], 0 where hidden
    dp = jnp.einsum("bqkgd,bskd->bkgqs", dog, v.astype(F32), **HP)
    ds = p * (dp - delta.reshape(B, K, G, Sq)[..., None]) * softmax_scale
    if t is not None:
        ds = ds * (1.0 - t * t)
    dq = jnp.einsum("bkgqs,bskd->bqkgd", ds, k.astype(F32), **HP).reshape(B, Sq, H, D)
    dk = jnp.einsum("bkgqs,bqkgd->bskd", ds, qg, **HP)
    dv = jnp.einsum("bkgqs,bqkgd->bskd", p, dog, **HP)
    return dq, dk, dv
