"""LLaMA 2 / 3 / 3.1 / 3.2 in Flax Linen with exact ring attention over the sequence axis.

Ring Attention with Blockwise Transformers (Liu, Zaharia & Abbeel 2023); LLaMA (Touvron et al.
2023); The Llama 3 Herd of Models (Grattafiori et al. 2024). Functional API (params are plain
pytrees of arrays, ready for optax / orbax):

- ``LlamaConfig`` (frozen dataclass), ``PRESETS`` ("debug", "1b", "3b", "7b", "8b", "70b"),
  ``get_config(name, **overrides)``. Fields: vocab_size, hidden_size, intermediate_size, num_layers,
  num_heads, num_kv_heads, head_dim, v_head_dim (None | v's own head dim: MLA shapes), rope_theta,
  rope_scaling (None | RopeScaling), rms_norm_eps, tie_embeddings, max_position_embeddings,
  sliding_window (None | W: Mistral's window of the last W tokens), family / layer_types /
  query_pre_attn_scalar / attn_logit_softcap / final_logit_softcap / num_experts /
  experts_per_token / swiglu_alpha / swiglu_limit (Qwen3, Gemma 2, gpt-oss: docs/api.md "Model
  families"), dtype / param_dtype ("bfloat16" | "float32"),
  attention ("auto" | "xla" | registered kernel | "reference" | "cudnn" (one GPU, no packing)),
  layout ("zigzag" (default: balanced causal work) | "striped" | "contiguous"),
  remat ("none" | "full" | "save_dots" | "save_attn" | "offload_attn"),
  scan_layers, mlp_chunk (None | tokens per MLP chunk), loss_chunk (None = plain loss | tokens per
  loss chunk), q_chunk, kv_chunk (ring inner-loop block sizes), interpret (Pallas interpret mode),
  deterministic (ring attention kernels with a fixed summation order; see ``ring_attention``).
- ``models.sharding.MeshConfig(dp=1, fsdp=1, tp=1, sp=1, usp=1)`` (one may be -1) and
  ``make_mesh(mesh_config, devices=None) -> Mesh`` with axes ("dp", "fsdp", "tp", "sp", "usp"); "usp"
  > 1 adds Ulysses' head exchange to the ring (the sequence is split over ("sp", "usp")).
- ``init_params(config, rng, mesh=None) -> params`` (created sharded when ``mesh`` is given).
- ``forward(config, params, input_ids, *, positions=None, segment_ids=None, mesh=None)``
  -> float32 logits [batch, seq, vocab]; inputs and outputs in NATURAL order.
- ``loss_fn(config, params, batch, *, mesh=None) -> (loss, aux)``; ``batch`` holds [batch, seq]
  ``input_ids``, ``targets``, ``positions``, ``segment_ids``, ``loss_mask`` ALREADY in ring-layout
  order (``ringattention.layouts.to_layout(x, config.layout, mesh.shape["sp"])``). Mean loss over
  ``loss_mask``; aux: "tokens", "loss_sum". Chunked cross-entropy, never [seq, vocab] logits.
- ``load_hf(path) -> (config, params)``, ``save_hf(config, params, path)`` (LLaMA, Mistral, Qwen3,
  Gemma 2 and gpt-oss checkpoints, ``config.family``; no torch needed).
- ``num_params(config)``; ``flops_per_token(config, seq_len)`` (6N + causal attention, one document
  per row) and ``batch_flops(config, segment_ids)`` (counted from a batch's documents on the host,
  any layout order; ``models.flops`` also holds the peak rates MFU divides by).
- Extras: ``abstract_params(config)``, ``param_specs(config, mesh)``, ``param_shardings(config,
  mesh)`` (e.g. to shard optimizer state), ``validate(config, mesh, shape)``.

Memory at long context (``scan_layers=True``): ``remat="full"`` saves one [batch, seq, embed] input
per layer and recomputes each block, ring attention's forward lap included; ``remat="save_attn"``
also saves each layer's attention output and float32 lse ([batch, seq, heads, head_dim] +
[batch, heads, seq]) so that the backward pass never re-runs the forward lap (about 1/3.5 less
attention work; the long presets' default); ``remat="offload_attn"`` keeps those two in pinned host
memory instead (GPU/TPU; ``ringattention.remat.allow_host_offload`` raises jax's pinned-host pool).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding

from models.config import PRESETS, LlamaConfig, RopeScaling, get_config, num_params
from models.flops import batch_flops, flops_per_token
from models.hf import load_hf, save_hf
from models.loss import chunked_cross_entropy_sum, cross_entropy_sum
from models.modules import Llama, default_positions, head_weight, soft_cap_logits
from models.sharding import axis_size, check_mesh, constrain, logical_spec
from ringattention import layouts

__all__ = [
    "PRESETS",
    "LlamaConfig",
    "RopeScaling",
    "abstract_params",
    "batch_flops",
    "flops_per_token",
    "forward",
    "get_config",
    "init_params",
    "load_hf",
    "loss_fn",
    "num_params",
    "param_shardings",
    "param_specs",
    "save_hf",
    "validate",
]

Params = Any
F32 = jnp.float32


def _boxed_abstract(config: LlamaConfig):
    # the parameters do not depend on the attention kernel: init traces the portable one, so a
    # config naming another platform's kernel (compiled for its mesh from this host), or one cut
    # to tiles longer than init's 2 tokens (pallas_tpu), still gives its parameters
    model = Llama(dataclasses.replace(config, attention="xla"), None)
    ids = jnp.zeros((1, 2), jnp.int32)
    init = lambda rng: model.init(rng, ids, ids, None)["params"]
    return init, jax.eval_shape(init, jax.random.key(0))


def abstract_params(config: LlamaConfig) -> Params:
    """ShapeDtypeStructs of the parameters (no memory allocated)."""
    return nn.meta.unbox(_boxed_abstract(config)[1])


def param_specs(config: LlamaConfig, mesh: Mesh | None = None) -> Params:
    """PartitionSpecs of the parameters from their logical axis names (a pytree like params)."""
    boxed = _boxed_abstract(config)[1]
    is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)
    return jax.tree.map(lambda b: logical_spec(b.names, b.value.shape, mesh), boxed, is_leaf=is_box)


def param_shardings(config: LlamaConfig, mesh: Mesh) -> Params:
    """NamedShardings of the parameters on ``mesh``."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(config, mesh))


def init_params(config: LlamaConfig, rng: jax.Array, mesh: Mesh | None = None) -> Params:
    """Random parameters (normal(0.02) weights, unit norms), created sharded on ``mesh``."""
    check_mesh(mesh)
    validate(config, mesh)
    init, _ = _boxed_abstract(config)
    out = None if mesh is None else param_shardings(config, mesh)
    return jax.jit(lambda r: nn.meta.unbox(init(r)), out_shardings=out)(rng)


def validate(config: LlamaConfig, mesh: Mesh | None = None, shape: tuple | None = None) -> None:
    """Raises ValueError if config, mesh and an input ``shape`` [batch, seq] don't fit together."""
    config.validate()
    check_mesh(mesh)
    tp, sp, usp = axis_size(mesh, "tp"), axis_size(mesh, "sp"), axis_size(mesh, "usp")
    nb = axis_size(mesh, "dp") * axis_size(mesh, "fsdp")
    if config.num_heads % tp or config.num_kv_heads % tp:
        raise ValueError(
            f"num_heads={config.num_heads} and num_kv_heads={config.num_kv_heads} "
            f"must both be divisible by the tp axis size {tp}"
        )
    if (config.num_heads // tp) % usp:
        raise ValueError(
            f"num_heads={config.num_heads} / tp={tp} must be divisible by the Ulysses axis size usp={usp}"
        )
    if shape is None:
        return
    if len(shape) != 2:
        raise ValueError(f"input_ids must be [batch, seq]; got shape={tuple(shape)}")
    if shape[0] % nb:
        raise ValueError(f"batch={shape[0]} is not divisible by dp*fsdp={nb}")
    layouts.check_divisible(shape[1], config.layout, sp)
    if shape[1] % (sp * usp):
        raise ValueError(f"seq={shape[1]} is not divisible by sp*usp={sp * usp}")


def _check_ints(name: str, x, shape) -> None:
    if x is None:
        return
    if tuple(x.shape) != tuple(shape):
        raise ValueError(
            f"{name} must have the shape of input_ids {tuple(shape)}; got {name}.shape={tuple(x.shape)}"
        )
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"{name} must be integers; got {name}.dtype={x.dtype}")


def _hidden(config, mesh, params, input_ids, positions, segment_ids):
    spec = ("act_batch", "act_seq")
    ids, pos = constrain(input_ids, spec, mesh), constrain(positions, spec, mesh)
    seg = None if segment_ids is None else constrain(segment_ids.astype(jnp.int32), spec, mesh)
    return Llama(config, mesh).apply({"params": params}, ids, pos, seg)  # [B, S, E]


@functools.lru_cache(maxsize=64)
def _forward_fn(config: LlamaConfig, mesh: Mesh | None):
    n = axis_size(mesh, "sp")

    def run(params, input_ids, positions, segment_ids):
        to = lambda x: None if x is None else layouts.to_layout(x, config.layout, n)
        h = _hidden(config, mesh, params, to(input_ids), to(positions), to(segment_ids))
        w = head_weight(config, params).astype(h.dtype)
        logits = soft_cap_logits(config, jnp.einsum("bse,ev->bsv", h, w, preferred_element_type=F32))
        logits = constrain(logits, ("act_batch", "act_seq", "act_vocab"), mesh)
        return layouts.from_layout(logits, config.layout, n)

    return jax.jit(run)


def forward(
    config: LlamaConfig,
    params: Params,
    input_ids: jax.Array,
    *,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    mesh: Mesh | None = None,
) -> jax.Array:
    """float32 logits [batch, seq, vocab] for int input_ids [batch, seq] in natural order.

    ``positions`` (default ``arange(seq)``) feed RoPE, e.g. restarting at every packed document;
    ``segment_ids`` keep packed documents from attending to each other. With a mesh whose "sp" axis
    is > 1 the sequence is reordered into ``config.layout``, run through the ring and put back.
    """
    input_ids = jnp.asarray(input_ids)
    validate(config, mesh, input_ids.shape)
    _check_ints("input_ids", input_ids, input_ids.shape)
    _check_ints("positions", positions, input_ids.shape)
    _check_ints("segment_ids", segment_ids, input_ids.shape)
    if positions is None:
        positions = default_positions(*input_ids.shape, "contiguous", 1)
    return _forward_fn(config, mesh)(params, input_ids, positions, segment_ids)


@functools.lru_cache(maxsize=64)
def _loss_fn(config: LlamaConfig, mesh: Mesh | None):
    def run(params, ids, targets, positions, segment_ids, mask):
        h = _hidden(config, mesh, params, ids, positions, segment_ids)
        w = head_weight(config, params)
        t = constrain(targets, ("act_batch", "act_seq"), mesh)
        cap = config.final_logit_softcap
        if config.loss_chunk is None:
            loss_sum, tokens = cross_entropy_sum(h, w, t, mask, soft_cap=cap)
        else:
            loss_sum, tokens = chunked_cross_entropy_sum(
                h, w, t, mask, config.loss_chunk, mesh=mesh, soft_cap=cap
            )
        loss = loss_sum / jnp.maximum(tokens, 1.0)
        return loss, {"loss": loss, "loss_sum": loss_sum, "tokens": tokens}

    return jax.jit(run)


def loss_fn(
    config: LlamaConfig, params: Params, batch: dict, *, mesh: Mesh | None = None
) -> tuple[jax.Array, dict]:
    """Mean next-token cross-entropy over ``loss_mask``; returns (loss, aux).

    ``batch`` holds int [batch, seq] ``input_ids`` and ``targets`` and optionally ``positions``
    (default: the layout's global positions), ``segment_ids`` and ``loss_mask`` (default all ones),
    all already in ``config.layout`` order for the mesh's sp size. aux: "loss", "loss_sum" (float32
    sum over tokens) and "tokens" (float32 sum of loss_mask).
    """
    if not isinstance(batch, dict) or "input_ids" not in batch or "targets" not in batch:
        raise ValueError(
            f"batch must be a dict with 'input_ids' and 'targets'; got "
            f"{type(batch).__name__} with keys {list(getattr(batch, 'keys', list)())}"
        )
    ids = jnp.asarray(batch["input_ids"])
    validate(config, mesh, ids.shape)
    for name in ("input_ids", "targets", "positions", "segment_ids"):
        _check_ints(name, batch.get(name), ids.shape)
    positions = batch.get("positions")
    if positions is None:
        positions = default_positions(*ids.shape, config.layout, axis_size(mesh, "sp"))
    mask = batch.get("loss_mask")
    mask = jnp.ones(ids.shape, F32) if mask is None else jnp.asarray(mask)
    if mask.shape != ids.shape:
        raise ValueError(f"loss_mask.shape={mask.shape} must equal input_ids.shape={ids.shape}")
    return _loss_fn(config, mesh)(
        params, ids, batch["targets"], positions, batch.get("segment_ids"), mask.astype(F32)
    )
