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
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from models.config import LlamaConfig, rope_attention_factor, rope_inv_freq
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


def rope_tables(config: LlamaConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos, sin float32 [batch, seq, head_dim // 2] for int positions [batch, seq] (times YaRN's
    attention factor when configured)."""
    inv = jnp.asarray(rope_inv_freq(config))  # [head_dim // 2]
    angles = positions.astype(F32)[..., None] * inv  # [batch, seq, head_dim // 2]
    m = rope_attention_factor(config)
    if m == 1.0:
        return jnp.cos(angles), jnp.sin(angles)
    return jnp.cos(angles) * m, jnp.sin(angles) * m


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates halves of x [batch, seq, heads, head_dim] (the Hugging Face LLaMA convention)."""
    x1, x2 = jnp.split(x.astype(F32), 2, axis=-1)  # [B, S, H, D/2]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)


def attention_options(config: LlamaConfig, sinks: jax.Array | None = None) -> dict:
    """The keyword options of ring / reference attention a model family sets (scale, soft cap,
    sinks [heads]); empty for LLaMA and Mistral."""
    out = {}
    if config.softmax_scale is not None:
        out["softmax_scale"] = config.softmax_scale
    if config.attn_logit_softcap is not None:
        out["logits_soft_cap"] = float(config.attn_logit_softcap)
    if sinks is not None:
        out["sinks"] = sinks
    return out


def attention_needs(config: LlamaConfig) -> frozenset[str]:
    """The optional ring-step features (``ringattention.implementations.FEATURES``) the model's
    attention uses: "softcap" (Gemma 2), "v_head_dim" (MLA shapes)."""
    used = {"softcap": config.attn_logit_softcap is not None, "v_head_dim": config.v_dim != config.head_dim}
    return frozenset(name for name, on in used.items() if on)


def attend(
    config: LlamaConfig,
    mesh: Mesh | None,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None,
    layer: int = 0,
    sinks: jax.Array | None = None,
) -> jax.Array:
    """Causal attention of q/k [B, S, H | K, D], v [B, S, K, Dv] in ring-layout order -> [B, S, H,
    Dv] over the last ``config.layer_window(layer)`` positions when set, with the family's options
    (``sinks`` [H] float32: one extra softmax logit per head that takes weight but has no value)."""
    n = axis_size(mesh, "sp")
    window = config.layer_window(layer)
    opts = attention_options(config, None)
    if config.attention == "reference":
        pos = jnp.asarray(layouts.positions(q.shape[1], config.layout, n))  # [S] global
        if sinks is not None:
            opts["sinks"] = sinks
        return reference_attention(
            q,
            k,
            v,
            causal=True,
            segment_ids=segment_ids,
            q_positions=pos,
            kv_positions=pos,
            sliding_window=window,
            **opts,
        ).astype(q.dtype)
    if config.attention == "cudnn":
        return _cudnn_attention(q, k, v, segment_ids, mesh, window, config, sinks)
    # for the mesh's platform (not the host's) and the ring's shard length
    impl = ra_impl.resolve(config.attention, mesh, shard=q.shape[1] // n, needs=attention_needs(config)).name
    blocks = BlockSizes(config.q_chunk, config.kv_chunk) if impl == "xla" else None
    seq, ulysses_axis = attention_axes(mesh)  # ("sp", "usp") with Ulysses: ring axis major
    kw = dict(
        causal=True,
        layout=config.layout,
        implementation=impl,
        block_sizes=blocks,
        interpret=config.interpret,
        deterministic=config.deterministic,
        ulysses_axis=ulysses_axis,
        **opts,
    )
    if window is not None:
        kw["sliding_window"] = window

    def local(q, k, v, s, sk=None):  # sk: this device's sinks [H / tp]
        extra = {} if sk is None else {"sinks": sk}
        return ring_attention(q, k, v, "sp", segment_ids=s, **kw, **extra)

    args = (q, k, v, segment_ids) + (() if sinks is None else (sinks,))
    if mesh is None:  # a ring of one: the blockwise step with its O(S) memory, no mesh needed
        add = lambda x: None if x is None else x[None]
        one = jax.vmap(local, in_axes=(0, 0, 0, 0, None)[: len(args)], axis_name="sp", axis_size=1)
        return one(add(q), add(k), add(v), add(segment_ids), *args[4:])[0]
    spec, seg_spec = P(BATCH, seq, "tp", None), P(BATCH, seq)
    specs = (spec, spec, spec, seg_spec, P("tp"))[: len(args)]
    return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=spec)(*args)


def _cudnn_attention(
    q,
    k,
    v,
    segment_ids,
    mesh,
    window: int | None = None,
    config: LlamaConfig | None = None,
    sinks: jax.Array | None = None,
):
    """Single-device causal attention through cuDNN's fused kernel (a speed baseline for one GPU)."""
    platform, ring = ra_impl.platform(mesh), seq_shards(mesh)
    if sinks is not None or (config is not None and attention_needs(config)):
        fields = {"softcap": "attn_logit_softcap", "v_head_dim": "v_head_dim"}
        option = (
            "sinks" if sinks is not None else " and ".join(fields[n] for n in sorted(attention_needs(config)))
        )
        raise ValueError(
            f"attention='cudnn' cannot do {option} ({config.family}); use attention='auto' or 'xla'"
        )
    if platform != "gpu" or ring != 1 or segment_ids is not None:
        raise ValueError(
            f"attention='cudnn' runs on one CUDA GPU without packing; got {platform=}, "
            f"sp*usp={ring}, segment_ids {'given' if segment_ids is not None else 'None'}"
        )
    local = None if window is None else (window - 1, 0)  # keys i - (W - 1) .. i
    scale = None if config is None else config.softmax_scale
    return jax.nn.dot_product_attention(
        q, k, v, is_causal=True, implementation="cudnn", local_window_size=local, scale=scale
    )


class RMSNorm(nn.Module):
    """RMSNorm over the last axis. Gemma 2 (``family="gemma2"``) stores ``scale`` as Hugging Face
    does, an offset from one: y * (1 + scale), multiplied in float32."""

    config: LlamaConfig

    @nn.compact
    def __call__(self, x):  # [..., embed]
        gemma = self.config.family == "gemma2"
        init = nn.initializers.zeros if gemma else nn.initializers.ones
        scale = _param(self, "scale", (x.shape[-1],), ("norm",), init)
        xf = x.astype(F32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + self.config.rms_norm_eps)
        dt = jnp.dtype(self.config.dtype)
        if gemma:
            return (y * (1.0 + scale.astype(F32))).astype(dt)
        return y.astype(dt) * scale.astype(dt)


class Attention(nn.Module):
    """Grouped-query attention of layer ``layer`` (which picks its sliding window); v and the
    output projection's input have ``config.v_dim`` per head (MLA shapes).
    Family extras: qwen3 RMSNorms q and k per head before RoPE; gpt_oss adds q/k/v/o biases and
    per-head sink logits."""

    config: LlamaConfig
    mesh: Mesh | None = None
    layer: int = 0

    @nn.compact
    def __call__(self, x, cos, sin, segment_ids):  # x [B, S, E]
        c, dt = self.config, jnp.dtype(self.config.dtype)
        E, H, K, D, Dv = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.v_dim
        bias = c.family == "gpt_oss"
        wq = _param(self, "wq", (E, H, D), ("embed", "heads", "head_dim"), _dense_init())
        wk = _param(self, "wk", (E, K, D), ("embed", "kv_heads", "head_dim"), _dense_init())
        wv = _param(self, "wv", (E, K, Dv), ("embed", "kv_heads", "head_dim"), _dense_init())
        wo = _param(self, "wo", (H, Dv, E), ("heads", "head_dim", "embed"), _dense_init())

        def proj(name, w, heads, names):  # -> [B, S, heads, D (v: Dv)]
            y = jnp.einsum("bse,ehd->bshd", x, w.astype(dt))
            if bias:
                b = _param(
                    self,
                    f"b{name[1]}",
                    (heads, w.shape[-1]),  # "act_heads" -> "heads"
                    (names.removeprefix("act_"), "head_dim"),
                    nn.initializers.zeros,
                )
                y = y + b.astype(dt)
            return constrain(y, ("act_batch", "act_seq", names, None), self.mesh)

        q, k = proj("wq", wq, H, "act_heads"), proj("wk", wk, K, "act_kv_heads")
        if c.family == "qwen3":
            q, k = RMSNorm(c, name="q_norm")(q), RMSNorm(c, name="k_norm")(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # [B, S, H | K, D]
        v = proj("wv", wv, K, "act_kv_heads")
        sinks = None
        if c.family == "gpt_oss":
            sinks = _param(self, "sinks", (H,), ("heads",), _dense_init()).astype(F32)
        o = attend(c, self.mesh, q, k, v, segment_ids, self.layer, sinks).astype(dt)
        out = jnp.einsum("bshd,hde->bse", o, wo.astype(dt))  # [B, S, H, Dv] -> [B, S, E]
        if bias:
            out = out + _param(self, "bo", (E,), ("norm",), nn.initializers.zeros).astype(dt)
        return constrain(out, ("act_batch", "act_seq", "act_embed"), self.mesh)


def _per_shard_chunks(config: LlamaConfig, mesh: Mesh | None, ffn, x):
    """``ffn`` [..., E] -> [..., E] on x [B, S, E], whole or ``config.mlp_chunk`` tokens at a time."""
    if config.mlp_chunk is None:
        return ffn(x)
    B, S, E = x.shape
    n = seq_shards(mesh)  # chunk within each device's shard, not across shards
    x4 = constrain(
        x.reshape(B, n, S // n, E), ("act_batch", "act_seq", None, "act_embed"), mesh
    )  # [B, ring, shard, E]
    y = blockwise_feedforward(ffn, x4, largest_divisor(S // n, config.mlp_chunk), axis=2)
    return y.reshape(B, S, E)


class MLP(nn.Module):
    """Gated MLP: SwiGLU, or GeGLU with tanh GELU for gemma2."""

    config: LlamaConfig
    mesh: Mesh | None = None

    @nn.compact
    def __call__(self, x):  # [B, S, E]
        c, dt = self.config, jnp.dtype(self.config.dtype)
        E, F = c.hidden_size, c.intermediate_size
        wg = _param(self, "w_gate", (E, F), ("embed", "mlp"), _dense_init()).astype(dt)
        wu = _param(self, "w_up", (E, F), ("embed", "mlp"), _dense_init()).astype(dt)
        wd = _param(self, "w_down", (F, E), ("mlp", "embed"), _dense_init()).astype(dt)
        act = (lambda g: jax.nn.gelu(g, approximate=True)) if c.family == "gemma2" else jax.nn.silu

        def ffn(h):  # [..., E] -> [..., E]
            g = jnp.einsum("...e,ef->...f", h, wg)  # [..., F]
            u = jnp.einsum("...e,ef->...f", h, wu)
            a = (act(g.astype(F32)) * u.astype(F32)).astype(dt)  # [..., F]
            return jnp.einsum("...f,fe->...e", a, wd)

        return _per_shard_chunks(c, self.mesh, ffn, x)


class MoE(nn.Module):
    """gpt-oss mixture of experts, computed densely: every expert runs on every token and the
    outputs are weighted by the router (the softmax of the top ``experts_per_token`` logits, 0
    elsewhere); exact, but ``num_experts`` times an MLP's work (tiny models, tests). Experts keep
    Hugging Face's interleaved ``w_gate_up`` [X, E, 2F] (gate at even, up at odd columns)."""

    config: LlamaConfig
    mesh: Mesh | None = None

    @nn.compact
    def __call__(self, x):  # [B, S, E]
        c, dt = self.config, jnp.dtype(self.config.dtype)
        E, F, X = c.hidden_size, c.intermediate_size, c.num_experts
        normal, zeros = _dense_init(), nn.initializers.zeros
        p = lambda name, shape, names, init=normal: _param(self, name, shape, names, init).astype(dt)
        wr, br = p("router", (E, X), ("embed", "experts")), p("router_bias", (X,), ("experts",))
        wgu = p("w_gate_up", (X, E, 2 * F), ("experts", "embed", "mlp"))
        bgu = p("b_gate_up", (X, 2 * F), ("experts", "mlp"), zeros)
        wd = p("w_down", (X, F, E), ("experts", "mlp", "embed"))
        bd = p("b_down", (X, E), ("experts", "norm"), zeros)

        def ffn(h):  # [..., E] -> [..., E]
            logits = jnp.einsum("...e,ex->...x", h, wr) + br  # [..., X]
            top, idx = jax.lax.top_k(logits.astype(F32), c.experts_per_token)  # [..., k]
            weight = jnp.sum(
                jax.nn.one_hot(idx, X, dtype=F32) * jax.nn.softmax(top)[..., None], axis=-2
            )  # [..., X], zero off the top k
            gu = (jnp.einsum("...e,xef->...xf", h, wgu) + bgu).astype(F32)  # [..., X, 2F]
            gate = jnp.minimum(gu[..., ::2], c.swiglu_limit)
            up = jnp.clip(gu[..., 1::2], -c.swiglu_limit, c.swiglu_limit)
            a = ((up + 1) * gate * jax.nn.sigmoid(c.swiglu_alpha * gate)).astype(dt)  # [..., X, F]
            y = jnp.einsum("...xf,xfe->...xe", a, wd) + bd  # [..., X, E]
            return jnp.einsum("...xe,...x->...e", y.astype(F32), weight).astype(dt)

        return _per_shard_chunks(c, self.mesh, ffn, x)


class Block(nn.Module):
    """Pre-norm decoder block number ``layer`` (which picks its sliding window); gemma2 also norms
    the attention and MLP outputs (``post_attn_norm``, ``post_mlp_norm``)."""

    config: LlamaConfig
    mesh: Mesh | None = None
    layer: int = 0

    @nn.compact
    def __call__(self, x, cos, sin, segment_ids):  # x [B, S, E]
        c, m = self.config, self.mesh
        post = (lambda name: RMSNorm(c, name=name)) if c.family == "gemma2" else (lambda name: lambda y: y)
        a = Attention(c, m, self.layer, name="attn")(RMSNorm(c, name="attn_norm")(x), cos, sin, segment_ids)
        h = x + post("post_attn_norm")(a)
        mlp = MoE if c.family == "gpt_oss" else MLP
        out = h + post("post_mlp_norm")(mlp(c, m, name="mlp")(RMSNorm(c, name="mlp_norm")(h)))
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
        return jax.tree.map(lambda b: b.replace(names=("layers", *b.names)), boxed, is_leaf=is_box)

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


def _layer_group(config: LlamaConfig, mesh: Mesh | None, period: int):
    """``group(p, h, cos, sin, seg)`` running layers 0 .. period-1 of params p [period, ...]."""
    blocks = [Block(config, mesh, j) for j in range(period)]

    def group(p, h, cos, sin, seg):
        for j, block in enumerate(blocks):
            h = block.apply({"params": jax.tree.map(lambda w: w[j], p)}, h, cos, sin, seg)[0]
        return h

    return group


def scan_blocks(
    config: LlamaConfig,
    mesh: Mesh | None,
    stacked: Any,
    x: jax.Array,
    cos: jax.Array,
    sin: jax.Array,
    segment_ids: jax.Array | None,
) -> jax.Array:
    """Runs the blocks with a scan over stacked params [layers, ...].

    Layers whose windows differ (``config.layer_types``) run as a scan over groups of
    ``config.layer_period`` layers. ``remat="full"`` uses a layer scan with its own VJP
    (:func:`_full_remat_scan`: one saved input per layer (per group), each block recomputed under
    ``jax.vjp``). The other policies differentiate a plain
    ``lax.scan`` over ``jax.checkpoint``: "save_attn" / "offload_attn" keep ring attention's named
    output and lse (``ringattention.remat``) next to each layer's input, so the backward pass
    recomputes the projections and the MLP but never the ring's forward lap.
    """
    period = config.layer_period
    if period == 1:
        block = Block(config, mesh)
        layer = lambda p, h, cos, sin, seg: block.apply({"params": p}, h, cos, sin, seg)[0]
    else:  # a scan over groups of ``period`` layers, e.g. (sliding, full): static windows
        layer = _layer_group(config, mesh, period)
        stacked = jax.tree.map(lambda w: w.reshape(-1, period, *w.shape[1:]), stacked)
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
        emb = _param(self, "embedding", (c.vocab_size, c.hidden_size), ("vocab", "embed"), _dense_init())
        if not c.tie_embeddings:
            _param(self, "lm_head", (c.hidden_size, c.vocab_size), ("embed", "vocab"), _dense_init())
        table = constrain(emb.astype(dt), ("vocab", None), m)  # gathered over fsdp/sp for lookup
        x = jnp.take(table, input_ids, axis=0)  # [B, S, E]
        if c.family == "gemma2":  # times sqrt(hidden), rounded to the compute dtype as in HF
            x = x * jnp.asarray(c.hidden_size**0.5, dt)
        x = constrain(x, ("act_batch", "act_seq", "act_embed"), m)
        cos, sin = rope_tables(c, positions)  # [B, S, D/2]
        if c.scan_layers:
            # parameter shapes do not depend on the attention kernel: initialise with the naive one
            init_block = Block(dataclasses.replace(c, attention="reference"), None)
            init = _stacked_init(init_block, c.num_layers, x, cos, sin, segment_ids)
            x = scan_blocks(c, m, self.param("layers", init), x, cos, sin, segment_ids)
        else:
            block = _block_class(c)
            for i in range(c.num_layers):
                x, _ = block(c, m, i, name=f"layers_{i}")(x, cos, sin, segment_ids)
        return RMSNorm(c, name="final_norm")(x)


def soft_cap_logits(config: LlamaConfig, logits: jax.Array) -> jax.Array:
    """``cap * tanh(logits / cap)`` with ``config.final_logit_softcap`` (Gemma 2), else as is."""
    cap = config.final_logit_softcap
    return logits if cap is None else cap * jnp.tanh(logits / cap)


def head_weight(config: LlamaConfig, params: Any) -> jax.Array:
    """The output projection [embed, vocab] (the transposed embedding when tied)."""
    if config.tie_embeddings:
        return params["embedding"].T
    return params["lm_head"]


def default_positions(batch: int, seq: int, layout: str, ring: int) -> jax.Array:
    """Global positions of a sequence in ring-layout order, int32 [batch, seq]."""
    pos = np.asarray(layouts.positions(seq, layout, ring), np.int32)
    return jnp.broadcast_to(jnp.asarray(pos), (batch, seq))
