"""Flax Linen modules of the LLaMA decoder; attention is ring attention over the "sp" mesh axis.

LLaMA (Touvron et al. 2023): pre-RMSNorm blocks, SwiGLU MLP, rotary embeddings (RoFormer, Su et al.
2021) with grouped-query attention. Ring Attention with Blockwise Transformers (Liu et al. 2023):
the attention of a sequence sharded over "sp" runs ``ringattention.ring_attention`` inside
``shard_map`` (a "usp" axis > 1 adds Ulysses' all-to-all over heads, ``ringattention.ulysses``), the
MLP optionally runs chunk by chunk (``blockwise_feedforward``). All parameters
carry logical axis names (``models.sharding.RULES``). Matmuls take and return the compute dtype
(XLA's bf16 GEMMs accumulate in float32), so that their gradients are bf16 GEMMs too: a float32
output would make every backward GEMM a float32 (TF32 on GPU) one (benchmarks/results/model_1b_h200.md).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from models.config import LlamaConfig, rope_inv_freq
from models.sharding import BATCH, attention_axes, axis_size, constrain, seq_shards
from ringattention import (
    BlockSizes,
    blockwise_feedforward,
    layouts,
    reference_attention,
    remat,
    ring_attention,
)
from ringattention import implementations as ra_impl

F32 = jnp.float32
REMAT = {  # what a rematerialised block keeps for its backward pass (besides its input)
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "save_attn": remat.save_attention(),  # ring attention's o and lse: no second forward lap
    "offload_attn": remat.offload_attention(),  # the same, held in pinned host memory
}


def _param(module: nn.Module, name: str, shape, names, init):
    init = nn.with_logical_partitioning(init, names)
    return module.param(name, init, shape, jnp.dtype(module.config.param_dtype))


def _dense_init(std: float = 0.02):
    return nn.initializers.normal(stddev=std)


def largest_divisor(length: int, request: int) -> int:
    """The largest divisor of ``length`` that is <= ``request``."""
    c = max(1, min(length, request))
    while length % c:
        c -= 1
    return c


def rope_tables(config: LlamaConfig, positions: jax.Array):
    """cos, sin float32 [batch, seq, head_dim // 2] for int positions [batch, seq]."""
    inv = jnp.asarray(rope_inv_freq(config))  # [head_dim // 2]
    angles = positions.astype(F32)[..., None] * inv  # [batch, seq, head_dim // 2]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates halves of x [batch, seq, heads, head_dim] (the Hugging Face LLaMA convention)."""
    x1, x2 = jnp.split(x.astype(F32), 2, axis=-1)  # [B, S, H, D/2]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)


def attend(config: LlamaConfig, mesh: Mesh | None, q, k, v, segment_ids):
    """Causal attention of q [B, S, H, D], k/v [B, S, K, D] in ring-layout order -> [B, S, H, D]
    (over the last ``config.sliding_window`` positions when set)."""
    n = axis_size(mesh, "sp")
    window = config.sliding_window
    if config.attention == "reference":
        pos = jnp.asarray(layouts.positions(q.shape[1], config.layout, n))  # [S] global
        return reference_attention(q, k, v, causal=True, segment_ids=segment_ids, q_positions=pos,
                                   kv_positions=pos, sliding_window=window).astype(q.dtype)
    if config.attention == "cudnn":
        return _cudnn_attention(q, k, v, segment_ids, mesh, window)
    # for the mesh's platform (not the host's) and the ring's shard length
    impl = ra_impl.resolve(config.attention, mesh, shard=q.shape[1] // n).name
    blocks = BlockSizes(config.q_chunk, config.kv_chunk) if impl == "xla" else None
    seq, ulysses_axis = attention_axes(mesh)  # ("sp", "usp") with Ulysses: ring axis major
    kw = dict(causal=True, layout=config.layout, implementation=impl, block_sizes=blocks,
              interpret=config.interpret, deterministic=config.deterministic,
              ulysses_axis=ulysses_axis)
    if window is not None:
        kw["sliding_window"] = window
    local = lambda q, k, v, s: ring_attention(q, k, v, "sp", segment_ids=s, **kw)
    if mesh is None:  # a ring of one: the blockwise step with its O(S) memory, no mesh needed
        one = jax.vmap(local, axis_name="sp", axis_size=1)
        add = lambda x: None if x is None else x[None]
        return one(add(q), add(k), add(v), add(segment_ids))[0]
    spec, seg_spec = P(BATCH, seq, "tp", None), P(BATCH, seq)
    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, seg_spec),
                         out_specs=spec)(q, k, v, segment_ids)


def _cudnn_attention(q, k, v, segment_ids, mesh, window: int | None = None):
    """Single-device causal attention through cuDNN's fused kernel (a speed baseline for one GPU)."""
    platform, ring = ra_impl.platform(mesh), seq_shards(mesh)
    if platform != "gpu" or ring != 1 or segment_ids is not None:
        raise ValueError(f"attention='cudnn' runs on one CUDA GPU without packing; got {platform=}, "
                         f"sp*usp={ring}, segment_ids {'given' if segment_ids is not None else 'None'}")
    local = None if window is None else (window - 1, 0)  # keys i - (W - 1) .. i
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn",
                                        local_window_size=local)


class RMSNorm(nn.Module):
    config: LlamaConfig

    @nn.compact
    def __call__(self, x):  # [..., embed]
        scale = _param(self, "scale", (x.shape[-1],), ("norm",), nn.initializers.ones)
        xf = x.astype(F32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + self.config.rms_norm_eps)
        dt = jnp.dtype(self.config.dtype)
        return y.astype(dt) * scale.astype(dt)


class Attention(nn.Module):
    config: LlamaConfig
    mesh: Mesh | None = None

    @nn.compact
    def __call__(self, x, cos, sin, segment_ids):  # x [B, S, E]
        c, dt = self.config, jnp.dtype(self.config.dtype)
        E, H, K, D = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
        wq = _param(self, "wq", (E, H, D), ("embed", "heads", "head_dim"), _dense_init())
        wk = _param(self, "wk", (E, K, D), ("embed", "kv_heads", "head_dim"), _dense_init())
        wv = _param(self, "wv", (E, K, D), ("embed", "kv_heads", "head_dim"), _dense_init())
        wo = _param(self, "wo", (H, D, E), ("heads", "head_dim", "embed"), _dense_init())
        proj = lambda w, names: constrain(jnp.einsum("bse,ehd->bshd", x, w.astype(dt)),
                                          ("act_batch", "act_seq", names, None), self.mesh)
        q = apply_rope(proj(wq, "act_heads"), cos, sin)  # [B, S, H, D]
        k = apply_rope(proj(wk, "act_kv_heads"), cos, sin)  # [B, S, K, D]
        v = proj(wv, "act_kv_heads")
        o = attend(c, self.mesh, q, k, v, segment_ids).astype(dt)  # [B, S, H, D]
        out = jnp.einsum("bshd,hde->bse", o, wo.astype(dt))
        return constrain(out, ("act_batch", "act_seq", "act_embed"), self.mesh)


class MLP(nn.Module):
    config: LlamaConfig
    mesh: Mesh | None = None

    @nn.compact
    def __call__(self, x):  # [B, S, E]
        c, dt = self.config, jnp.dtype(self.config.dtype)
        E, F = c.hidden_size, c.intermediate_size
        wg = _param(self, "w_gate", (E, F), ("embed", "mlp"), _dense_init()).astype(dt)
        wu = _param(self, "w_up", (E, F), ("embed", "mlp"), _dense_init()).astype(dt)
        wd = _param(self, "w_down", (F, E), ("mlp", "embed"), _dense_init()).astype(dt)

        def ffn(h):  # [..., E] -> [..., E]
            g = jnp.einsum("...e,ef->...f", h, wg)  # [..., F]
            u = jnp.einsum("...e,ef->...f", h, wu)
            a = (jax.nn.silu(g.astype(F32)) * u.astype(F32)).astype(dt)  # [..., F]
            return jnp.einsum("...f,fe->...e", a, wd)

        if c.mlp_chunk is None:
            return ffn(x)
        B, S, _ = x.shape
        n = seq_shards(self.mesh)  # chunk within each device's shard, not across shards
        x4 = constrain(x.reshape(B, n, S // n, E), ("act_batch", "act_seq", None, "act_embed"),
                       self.mesh)  # [B, ring, shard, E]
        y = blockwise_feedforward(ffn, x4, largest_divisor(S // n, c.mlp_chunk), axis=2)
        return y.reshape(B, S, E)


class Block(nn.Module):
    config: LlamaConfig
    mesh: Mesh | None = None

    @nn.compact
    def __call__(self, x, cos, sin, segment_ids):  # x [B, S, E]
        c, m = self.config, self.mesh
        h = x + Attention(c, m, name="attn")(RMSNorm(c, name="attn_norm")(x), cos, sin,
                                              segment_ids)
        out = h + MLP(c, m, name="mlp")(RMSNorm(c, name="mlp_norm")(h))
        return constrain(out, ("act_batch", "act_seq", "act_embed"), m), None


def _block_class(config: LlamaConfig):
    if config.remat == "none":
        return Block
    return nn.remat(Block, policy=REMAT[config.remat], prevent_cse=True)


def _stacked_init(block: Block, num_layers: int, *args):
    """Initialiser of [layers, ...] block params, each named ("layers", *names)."""

    def init(rng):
        rngs = jax.random.split(rng, num_layers)
        boxed = jax.vmap(lambda r: block.init(r, *args)["params"])(rngs)
        is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)
        return jax.tree.map(lambda b: b.replace(names=("layers", *b.names)), boxed,
                            is_leaf=is_box)

    return init


def _full_remat_scan(layer, stacked, x, cos, sin, segment_ids):
    """``lax.scan`` of ``layer(p, h, cos, sin, seg)`` saving only each layer's input [L, B, S, E].

    The backward pass is a reverse scan that recomputes one layer at a time under ``jax.vjp``.
    """

    @jax.custom_vjp
    def run(stacked, x, cos, sin, seg):
        return jax.lax.scan(lambda h, p: (layer(p, h, cos, sin, seg), None), x, stacked)[0]

    def fwd(stacked, x, cos, sin, seg):
        y, inputs = jax.lax.scan(lambda h, p: (layer(p, h, cos, sin, seg), h), x, stacked)
        return y, (stacked, inputs, cos, sin, seg)

    def bwd(res, g):
        stacked, inputs, cos, sin, seg = res

        def body(g, xs):
            p, h = xs
            _, vjp = jax.vjp(lambda p, h: layer(p, h, cos, sin, seg), p, h)
            dp, dh = vjp(g)
            return dh, dp

        dx, dstacked = jax.lax.scan(body, g, (stacked, inputs), reverse=True)
        return dstacked, dx, jnp.zeros_like(cos), jnp.zeros_like(sin), None

    run.defvjp(fwd, bwd)
    return run(stacked, x, cos, sin, segment_ids)


def scan_blocks(config: LlamaConfig, mesh: Mesh | None, stacked, x, cos, sin, segment_ids):
    """Runs the blocks with a scan over stacked params [layers, ...].

    ``remat="full"`` uses a layer scan with its own VJP (:func:`_full_remat_scan`: one saved input
    per layer, each block recomputed under ``jax.vjp``). The other policies differentiate a plain
    ``lax.scan`` over ``jax.checkpoint``: "save_attn" / "offload_attn" keep ring attention's named
    output and lse (``ringattention.remat``) next to each layer's input, so the backward pass
    recomputes the projections and the MLP but never the ring's forward lap.
    """
    block = Block(config, mesh)
    layer = lambda p, h, cos, sin, seg: block.apply({"params": p}, h, cos, sin, seg)[0]
    if config.remat == "full":
        return _full_remat_scan(layer, stacked, x, cos, sin, segment_ids)

    body = lambda h, p: (layer(p, h, cos, sin, segment_ids), None)
    if config.remat != "none":
        body = jax.checkpoint(body, policy=REMAT[config.remat], prevent_cse=False)
    return jax.lax.scan(body, x, stacked)[0]


class Llama(nn.Module):
    """Token ids [B, S] (ring-layout order) -> final normed hidden states [B, S, E]."""

    config: LlamaConfig
    mesh: Mesh | None = None

    @nn.compact
    def __call__(self, input_ids, positions, segment_ids):
        c, m, dt = self.config, self.mesh, jnp.dtype(self.config.dtype)
        emb = _param(self, "embedding", (c.vocab_size, c.hidden_size), ("vocab", "embed"),
                     _dense_init())
        if not c.tie_embeddings:
            _param(self, "lm_head", (c.hidden_size, c.vocab_size), ("embed", "vocab"),
                   _dense_init())
        table = constrain(emb.astype(dt), ("vocab", None), m)  # gathered over fsdp/sp for lookup
        x = constrain(jnp.take(table, input_ids, axis=0),
                      ("act_batch", "act_seq", "act_embed"), m)  # [B, S, E]
        cos, sin = rope_tables(c, positions)  # [B, S, D/2]
        if c.scan_layers:
            # parameter shapes do not depend on the attention kernel: initialise with the naive one
            init_block = Block(dataclasses.replace(c, attention="reference"), None)
            init = _stacked_init(init_block, c.num_layers, x, cos, sin, segment_ids)
            x = scan_blocks(c, m, self.param("layers", init), x, cos, sin, segment_ids)
        else:
            block = _block_class(c)
            for i in range(c.num_layers):
                x, _ = block(c, m, name=f"layers_{i}")(x, cos, sin, segment_ids)
        return RMSNorm(c, name="final_norm")(x)


def head_weight(config: LlamaConfig, params) -> jax.Array:
    """The output projection [embed, vocab] (the transposed embedding when tied)."""
    if config.tie_embeddings:
        return params["embedding"].T
    return params["lm_head"]


def default_positions(batch: int, seq: int, layout: str, ring: int) -> jax.Array:
    """Global positions of a sequence in ring-layout order, int32 [batch, seq]."""
    pos = np.asarray(layouts.positions(seq, layout, ring), np.int32)
    return jnp.broadcast_to(jnp.asarray(pos), (batch, seq))
