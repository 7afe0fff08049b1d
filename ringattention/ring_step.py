"""The pieces of one ring step shared by the ring's laps (``ring.py``) and the all-gather's
(``all_gather.py``): the global positions of the query shard and of the key/value shard a step
holds (any layout), the test that skips a step no query can see, the keywords of the step call, and
the log-sum-exp merge of two partial results.

Ring Attention with Blockwise Transformers (Liu, Zaharia & Abbeel 2023): each step's partial
attention is merged into the running one in float32 by its log-sum-exp; FlashAttention's online
softmax (Dao et al. 2022) across shards instead of blocks.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ringattention import layouts, masks
from ringattention.lap_plan import runs


def merge(o1: jax.Array, lse1: jax.Array, o2: jax.Array, lse2: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Merges two normalised partial attentions. o [B, S, H, D] f32, lse [B, H, S] f32 (-inf: none)."""
    m = jnp.maximum(lse1, lse2)
    m_safe = jnp.where(jnp.isneginf(m), 0.0, m)
    w1, w2 = jnp.exp(lse1 - m_safe), jnp.exp(lse2 - m_safe)  # [B, H, S], 0 where lse is -inf
    total = w1 + w2
    seen = total > 0
    inv = 1.0 / jnp.where(seen, total, 1.0)
    t = lambda w: jnp.swapaxes(w * inv, 1, 2)[..., None]  # noqa: E731  [B, S, H, 1]
    o = o1 * t(w1) + o2 * t(w2)
    lse = jnp.where(seen, m_safe + jnp.log(jnp.where(seen, total, 1.0)), -jnp.inf)
    return o, lse


def step_visible(
    cfg: Any,
    q_pos: jax.Array,
    k_pos: jax.Array,
    q_seg: jax.Array | None,
    k_seg: jax.Array | None,
    prefix: jax.Array | None = None,
) -> jax.Array:
    """Scalar bool: can any query of this shard see any key of the held shard? (else the lap skips
    the step). ``cfg``: the ring's config (``ring._Config``); positions int32 [S], segment ids
    int32 [B, S] | None, ``prefix`` int32 [B] | None."""
    vis = jnp.bool_(True)
    causal = cfg.causal and not (cfg.prefix or cfg.bidirectional)  # else: causal, relaxed
    if cfg.causal:
        before = k_pos[0] <= q_pos[-1]  # positions increase within a shard
        if prefix is not None:
            before = before | (k_pos[0] < prefix.max())
        if cfg.bidirectional:
            before = before | jnp.any(q_seg < 0)
        vis = vis & before
    if cfg.window is not None:  # per run of consecutive positions (zigzag: two per shard)
        run = q_pos.shape[0] // runs(cfg.layout)
        k_run = math.gcd(k_pos.shape[0], run)  # all_gather: k may be a piece of a shard
        table = masks.block_table(q_pos, k_pos, None, None, causal, run, k_run, cfg.window)
        vis = vis & jnp.any(table != masks.SKIP)
    if q_seg is not None:
        lo = jnp.maximum(q_seg.min(-1), k_seg.min(-1))
        hi = jnp.minimum(q_seg.max(-1), k_seg.max(-1))
        vis = vis & jnp.any(lo <= hi)
    return vis


def step_args(
    cfg: Any, q: jax.Array, q_seg: jax.Array | None, k_seg: jax.Array | None, t: int | jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array | None]:
    """Global positions of this shard and of the shard held at ring step t (it came from r - t),
    and the segment ids, all tied to q: (q_pos int32 [S], k_pos int32 [S], q_seg, k_seg)."""
    n, s = cfg.ring_size, q.shape[1]
    r = lax.axis_index(cfg.axis_name)
    q_pos = layouts.shard_positions(cfg.layout, s, n, r)
    k_pos = layouts.shard_positions(cfg.layout, s, n, (r - t) % n)
    # Tie the positions to q: masks built from them alone are loop-invariant constants, and when
    # ring attention sits in a differentiated lax.scan (a layer stack) JAX would hoist every
    # chunk's mask out of the loops as an O(shard^2) residual. The barrier keeps them in the loop.
    (q_pos, k_pos, q_seg, k_seg), _ = lax.optimization_barrier(((q_pos, k_pos, q_seg, k_seg), q))
    return q_pos, k_pos, q_seg, k_seg


def step_kwargs(cfg: Any, prefix: jax.Array | None = None) -> dict:
    """The keywords of a step call (``implementations.py``'s contract): window and the optional
    features only where used."""
    kw = dict(
        causal=cfg.causal,
        softmax_scale=cfg.softmax_scale,
        block_sizes=cfg.block_sizes,
        interpret=cfg.interpret,
    )
    if cfg.window is not None:  # only then: implementations without windows keep working
        kw["window"] = cfg.window
    if cfg.softcap is not None:  # optional features likewise (implementations.FEATURES)
        kw["softcap"] = cfg.softcap
    if prefix is not None:
        kw["prefix"] = prefix
    if cfg.bidirectional:
        kw["bidirectional"] = True
    return kw
