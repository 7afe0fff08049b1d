"""Prefill and decode of a LLaMA with a sequence-sharded KV cache: ring-attention prefill, all-reduce
decode.

Ring Attention with Blockwise Transformers (Liu, Zaharia & Abbeel 2023) for the prefill of prompts
longer than one device holds (:func:`prefill`); :func:`extend` appends tokens (one per sequence: a
decode step) with every device's cache shard kept in place, merging per-device partial attention by
one small all-reduce (``models.kvcache``) instead of rotating the cache around the ring for every
token as Large World Model (Liu et al. 2024) does (``mode="rotate"``, the baseline). LLaMA (Touvron
et al. 2023) layer math is the same as ``models.modules`` (its RMSNorm / MLP modules and RoPE
functions are applied to the model's own parameter tree). Sampling, batching and the CLI:
``models.generate``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh

from models import kvcache
from models.config import LlamaConfig
from models.kvcache import KVCache
from models.modules import (
    MLP,
    RMSNorm,
    apply_rope,
    attend,
    default_positions,
    head_weight,
    rope_tables,
)
from models.sharding import axis_size, constrain
from ringattention import layouts
from ringattention.ring import merge

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

F32 = jnp.float32
CACHE_MODES = ("allreduce", "rotate")


def _stacked(config: LlamaConfig, params) -> Any:
    """Per-layer params stacked on a leading [layers] axis."""
    if config.scan_layers:
        return params["layers"]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *[params[f"layers_{i}"] for i in range(config.num_layers)])


def _embed(config: LlamaConfig, mesh, params, ids, seq_name):
    dt = jnp.dtype(config.dtype)
    table = constrain(params["embedding"].astype(dt), ("vocab", None), mesh)
    return constrain(jnp.take(table, ids, axis=0), ("act_batch", seq_name, "act_embed"), mesh)


def _norm(config: LlamaConfig, p, x):
    return RMSNorm(config).apply({"params": p}, x)


def _qkv(config: LlamaConfig, mesh, p, x, cos, sin, seq_name):
    """q [B, S, H, D], k/v [B, S, K, D] exactly as ``models.modules.Attention`` computes them."""
    dt = jnp.dtype(config.dtype)

    def proj(w, names):
        y = jnp.einsum("bse,ehd->bshd", x, w.astype(dt), preferred_element_type=F32).astype(dt)
        return constrain(y, ("act_batch", seq_name, names, None), mesh)

    q = apply_rope(proj(p["wq"], "act_heads"), cos, sin)
    k = apply_rope(proj(p["wk"], "act_kv_heads"), cos, sin)
    return q, k, proj(p["wv"], "act_kv_heads")


def _out(config: LlamaConfig, mesh, p, o, seq_name):
    dt = jnp.dtype(config.dtype)
    y = jnp.einsum("bshd,hde->bse", o.astype(dt), p["wo"].astype(dt), preferred_element_type=F32)
    return constrain(y.astype(dt), ("act_batch", seq_name, "act_embed"), mesh)


def _mlp_block(config: LlamaConfig, mesh, p, x, seq_name):
    y = MLP(config, mesh).apply({"params": p["mlp"]}, _norm(config, p["mlp_norm"], x))
    return constrain(x + y, ("act_batch", seq_name, "act_embed"), mesh)


def _logits(config: LlamaConfig, params, h):  # h [B, E] -> float32 [B, V]
    w = head_weight(config, params).astype(h.dtype)
    return jnp.einsum("be,ev->bv", h, w, preferred_element_type=F32)


@functools.lru_cache(maxsize=32)
def _prefill_fn(config: LlamaConfig, mesh: Mesh | None):
    n = axis_size(mesh, "sp")

    def run(params, tokens, lengths):  # tokens [B, T] natural order, lengths [B]
        B, T = tokens.shape
        ids = layouts.to_layout(tokens, config.layout, n)
        pos = default_positions(B, T, config.layout, n)  # [B, T] layout order
        x = _embed(config, mesh, params, ids, "act_seq")  # [B, T, E]
        cos, sin = rope_tables(config, pos)

        def layer(x, p):
            q, k, v = _qkv(config, mesh, p["attn"], _norm(config, p["attn_norm"], x), cos, sin, "act_seq")
            x = x + _out(config, mesh, p["attn"], attend(config, mesh, q, k, v, None), "act_seq")
            return _mlp_block(config, mesh, p, x, "act_seq"), (k, v)

        x, (ks, vs) = lax.scan(layer, x, _stacked(config, params))  # ks [L, B, T, K, D]
        sh = kvcache.cache_sharding(mesh)
        if sh is not None:
            ks, vs = (jax.lax.with_sharding_constraint(a, sh) for a in (ks, vs))
        inv = jnp.asarray(np.argsort(layouts.permutation(T, config.layout, n)).astype(np.int32))
        last = inv[lengths - 1]  # [B] layout index of each prompt's last token
        h = _norm(config, params["final_norm"], x[jnp.arange(B), last])  # [B, E]
        cache = KVCache(ks, vs, lengths.astype(jnp.int32), config.layout, n)
        return _logits(config, params, h), cache

    return jax.jit(run)


def prefill(
    config: LlamaConfig, params: Any, tokens: ArrayLike, lengths: ArrayLike, *, mesh: Mesh | None = None
) -> tuple[jax.Array, KVCache]:
    """Runs right-padded prompts tokens int [B, T] (natural order; T = the cache length) through
    the model with ring attention over "sp". Returns (float32 logits [B, V] of each prompt's last
    token ``lengths[b] - 1``, a KVCache of length T holding positions ``< lengths``)."""
    tokens = jnp.asarray(tokens, jnp.int32)
    lengths = jnp.asarray(lengths, jnp.int32)
    if tokens.ndim != 2 or lengths.shape != tokens.shape[:1]:
        raise ValueError(
            f"tokens must be [batch, T] and lengths [batch]; got {tokens.shape=} {lengths.shape=}"
        )
    kvcache.check_cache_mesh(config, mesh, *tokens.shape)
    return _prefill_fn(config, mesh)(params, tokens, lengths)


@functools.lru_cache(maxsize=32)
def _extend_fn(config: LlamaConfig, mesh: Mesh | None, mode: str):
    dense_cfg = dataclasses.replace(config, mlp_chunk=None)  # a few tokens: no MLP chunks
    scale = 1.0 / math.sqrt(config.head_dim)
    attn = kvcache.cache_attention if mode == "allreduce" else kvcache.rotating_cache_attention
    window = {} if config.sliding_window is None else {"window": config.sliding_window}

    def run(params, cache: KVCache, tokens, counts):  # tokens [B, C], counts [B]
        B, C = tokens.shape
        pos = cache.lengths[:, None] + jnp.arange(C, dtype=jnp.int32)[None]  # [B, C] global
        valid = jnp.arange(C)[None] < counts[:, None]
        x = _embed(config, mesh, params, tokens, None)  # [B, C, E]
        cos, sin = rope_tables(config, pos)

        def layer(x, xs):
            p, ck, cv = xs  # ck/cv [B, T, K, D] this layer's cache
            q, k, v = _qkv(config, mesh, p["attn"], _norm(config, p["attn_norm"], x), cos, sin, None)
            o_c, lse_c = attn(ck, cv, q, cache.lengths, layout=cache.layout, mesh=mesh, scale=scale, **window)
            o, _ = merge(o_c, lse_c, *kvcache.chunk_attention(q, k, v, scale, **window))
            x = x + _out(config, mesh, p["attn"], o, None)
            return _mlp_block(dense_cfg, mesh, p, x, None), (k, v)

        x, (ks, vs) = lax.scan(layer, x, (_stacked(config, params), cache.k, cache.v))
        cache = kvcache.write(cache, ks, vs, pos, valid, mesh)
        cache = dataclasses.replace(cache, lengths=cache.lengths + counts)
        last = jnp.clip(counts - 1, 0, C - 1)
        h = _norm(config, params["final_norm"], x[jnp.arange(B), last])  # [B, E]
        return _logits(config, params, h), cache

    return jax.jit(run, donate_argnums=(1,))


def extend(
    config: LlamaConfig,
    params: Any,
    cache: KVCache,
    tokens: ArrayLike,
    counts: ArrayLike | None = None,
    *,
    mesh: Mesh | None = None,
    mode: str = "allreduce",
) -> tuple[jax.Array, KVCache]:
    """Appends tokens int [B, C] (the first ``counts[b]`` of row b; default all) at positions
    ``cache.lengths[b] + i``. Returns (float32 logits [B, V] after each row's last new token, the
    updated cache). ``cache`` is donated. ``mode`` "rotate" is the per-token ring-rotation baseline.
    """
    if mode not in CACHE_MODES:
        raise ValueError(f"mode={mode!r}; choose one of {CACHE_MODES}")
    kvcache.check_decodable(config)
    if mode == "rotate" and config.sliding_window is not None:
        raise ValueError(
            f"mode='rotate' (the rotation baseline) has no sliding window; got "
            f"config.sliding_window={config.sliding_window}: use mode='allreduce'"
        )
    tokens = jnp.asarray(tokens, jnp.int32)
    B = cache.k.shape[1]
    if tokens.ndim != 2 or tokens.shape[0] != B:
        raise ValueError(f"tokens must be [batch={B}, chunk]; got {tokens.shape=}")
    counts = jnp.full((B,), tokens.shape[1], jnp.int32) if counts is None else jnp.asarray(counts, jnp.int32)
    if counts.shape != (B,):
        raise ValueError(f"counts must be [batch={B}]; got {counts.shape=}")
    if cache.ring != axis_size(mesh, "sp") or cache.layout != config.layout:
        raise ValueError(
            f"cache (layout={cache.layout!r}, ring={cache.ring}) does not match "
            f"config.layout={config.layout!r} and sp={axis_size(mesh, 'sp')}"
        )
    return _extend_fn(config, mesh, mode)(params, cache, tokens, counts)
