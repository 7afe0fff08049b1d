"""Hugging Face LLaMA, Mistral, Qwen3, Gemma 2 and gpt-oss checkpoints: config.json + safetensors
(single file or sharded), without torch.

Reads config.json as written by transformers 4.x (``rope_theta``, ``rope_scaling``) and 5.x
(``rope_parameters``) and maps ``LlamaForCausalLM`` weights to this package's parameter tree (LLaMA,
Touvron et al. 2023). ``MistralForCausalLM`` (Mistral 7B, Jiang et al. 2023) has the same weights;
its ``sliding_window`` becomes ``LlamaConfig.sliding_window``, and a config with a window is saved as
a Mistral checkpoint. The other families' fields and tensors are in ``models.hf_families``. The
safetensors format (8-byte little-endian header length, a JSON header of
dtype / shape / byte offsets, raw little-endian data) is read with numpy memory maps and written
here.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from einops import rearrange

from models import hf_families
from models.config import LlamaConfig, RopeScaling

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

_ST_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "F64": np.float64,
    "I64": np.int64,
    "I32": np.int32,
}
_NP_TO_ST = {np.dtype(v): k for k, v in _ST_DTYPES.items()}


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """Memory-mapped arrays of a .safetensors file by tensor name."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {meta['dtype']!r}")
        start, end = meta["data_offsets"]
        out[name] = data[start:end].view(_ST_DTYPES[meta["dtype"]]).reshape(meta["shape"])
    return out


def write_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
    """Writes numpy arrays (float32 / float16 / bfloat16 / ints) as a .safetensors file."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, x in tensors.items():
        if x.dtype not in _NP_TO_ST:
            raise TypeError(f"tensor {name!r} has unsupported dtype {x.dtype}")
        header[name] = {
            "dtype": _NP_TO_ST[x.dtype],
            "shape": list(x.shape),
            "data_offsets": [offset, offset + x.nbytes],
        }
        offset += x.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for x in tensors.values():
            f.write(np.ascontiguousarray(x).tobytes())


def config_from_hf(hf: dict, **overrides: Any) -> LlamaConfig:
    """LlamaConfig from a transformers config.json dict (4.x or 5.x; model_type "llama",
    "mistral", "qwen3", "gemma2" or "gpt_oss")."""
    family = hf_families.family_of(hf)
    rope = dict(hf.get("rope_parameters") or {})
    theta = hf.get("rope_theta", rope.get("rope_theta", 10000.0))
    scaling = hf.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind == "default":
            scaling = None
        elif kind == "yarn":
            scaling = hf_families.yarn_scaling(scaling, int(hf.get("max_position_embeddings", 4096)))
        elif kind != "llama3":
            raise ValueError(f"rope scaling type {kind!r} is not supported (only 'llama3', 'yarn')")
        else:
            scaling = RopeScaling(
                factor=float(scaling["factor"]),
                low_freq_factor=float(scaling["low_freq_factor"]),
                high_freq_factor=float(scaling["high_freq_factor"]),
                original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
            )
    heads = hf["num_attention_heads"]
    fields = dict(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rope_theta=float(theta),
        rope_scaling=scaling,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
    )
    if hf.get("model_type") == "mistral" and hf.get("sliding_window") is not None:
        fields["sliding_window"] = int(hf["sliding_window"])
    if family != "llama":
        fields.update(hf_families.family_fields(hf, family))
    else:
        for key in ("attention_bias", "mlp_bias"):
            if hf.get(key):
                raise ValueError(f"config.json has {key}=true; biases are not supported")
    if family != "gemma2" and hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={hf['hidden_act']!r} is not supported (only 'silu')")
    fields.update(overrides)
    return LlamaConfig(**fields)


def config_to_hf(config: LlamaConfig, torch_dtype: str) -> dict:
    """A transformers config.json dict (readable by transformers 4.x and 5.x): LLaMA, or Mistral
    when the config has a sliding window, or the config's family (Qwen3, Gemma 2, gpt-oss).
    ValueError for v's own head dim, which none of them has."""
    if config.v_dim != config.head_dim:
        raise ValueError(
            f"v_head_dim={config.v_head_dim} != head_dim={config.head_dim}: no "
            "transformers family with plain projections has v's own head dim "
            "(DeepSeek's MLA factors them); such a model saves no HF checkpoint"
        )
    out = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "tie_word_embeddings": config.tie_embeddings,
        "max_position_embeddings": config.max_position_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": torch_dtype,
        "dtype": torch_dtype,
    }
    rope = {"rope_type": "default", "rope_theta": config.rope_theta}
    s = config.rope_scaling
    if s is not None and s.rope_type == "yarn":
        scaling = hf_families.yarn_to_hf(s)
        out["rope_scaling"] = scaling
        rope = {**scaling, "rope_theta": config.rope_theta}
    elif s is not None:
        scaling = {
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        }
        out["rope_scaling"] = scaling
        rope = {**scaling, "rope_theta": config.rope_theta}
    out["rope_parameters"] = rope
    if config.family != "llama":
        out.update(hf_families.family_to_hf(config))
    elif config.sliding_window is not None:
        out.update(
            architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=config.sliding_window
        )
    return out


def _layer_map(config: LlamaConfig):
    """(hf suffix, our path, to_ours(w), to_hf(w)) for the tensors of one decoder layer."""
    H, K = config.num_heads, config.num_kv_heads
    t = lambda w: w.T
    # Hugging Face stores [out, in] matrices; ours are [embed, heads, head_dim] / [heads, head_dim, embed]
    proj_in = lambda n: (
        lambda w: rearrange(w, "(h d) e -> e h d", h=n),  # noqa: E731
        lambda w: rearrange(w, "e h d -> (h d) e"),
    )
    return hf_families.family_layer_map(
        config,
        [
            ("self_attn.q_proj.weight", ("attn", "wq"), *proj_in(H)),
            ("self_attn.k_proj.weight", ("attn", "wk"), *proj_in(K)),
            ("self_attn.v_proj.weight", ("attn", "wv"), *proj_in(K)),
            (
                "self_attn.o_proj.weight",
                ("attn", "wo"),
                lambda w: rearrange(w, "e (h d) -> h d e", h=H),
                lambda w: rearrange(w, "h d e -> e (h d)"),
            ),
            ("mlp.gate_proj.weight", ("mlp", "w_gate"), t, t),
            ("mlp.up_proj.weight", ("mlp", "w_up"), t, t),
            ("mlp.down_proj.weight", ("mlp", "w_down"), t, t),
            ("input_layernorm.weight", ("attn_norm", "scale"), lambda w: w, lambda w: w),
            ("post_attention_layernorm.weight", ("mlp_norm", "scale"), lambda w: w, lambda w: w),
        ],
    )


def _read_dir(path: str) -> dict[str, np.ndarray]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {path!r}")
    tensors = {}
    for name in files:
        tensors.update(read_safetensors(os.path.join(path, name)))
    return tensors


def params_from_hf(config: LlamaConfig, tensors: dict, dtype: DTypeLike) -> dict:
    """Our parameter tree (numpy, ``dtype``) from Hugging Face tensor names."""
    get = lambda name: np.asarray(tensors[name]).astype(dtype)
    missing = [n for n in ("model.embed_tokens.weight", "model.norm.weight") if n not in tensors]
    if missing:
        raise KeyError(f"checkpoint lacks {missing}")
    params = {
        "embedding": get("model.embed_tokens.weight"),
        "final_norm": {"scale": get("model.norm.weight")},
    }
    if not config.tie_embeddings:
        params["lm_head"] = get("lm_head.weight").T
    layers = []
    for i in range(config.num_layers):
        layer: dict = {}
        for suffix, (*mods, leaf), to_ours, _ in _layer_map(config):
            node = layer
            for mod in mods:
                node = node.setdefault(mod, {})
            node[leaf] = to_ours(get(f"model.layers.{i}.{suffix}"))
        layers.append(layer)
    if config.scan_layers:
        params["layers"] = jax.tree.map(lambda *xs: np.stack(xs), *layers)
    else:
        params.update({f"layers_{i}": layer for i, layer in enumerate(layers)})
    return params


def params_to_hf(config: LlamaConfig, params: Any, dtype: DTypeLike) -> dict[str, np.ndarray]:
    """Hugging Face tensor names -> numpy arrays in ``dtype``."""
    host = jax.tree.map(lambda x: np.asarray(jax.device_get(x)).astype(dtype), params)
    out = {"model.embed_tokens.weight": host["embedding"]}
    for i in range(config.num_layers):
        layer = jax.tree.map(lambda x: x[i], host["layers"]) if config.scan_layers else host[f"layers_{i}"]
        for suffix, path, _, to_hf in _layer_map(config):
            w = functools.reduce(lambda node, key: node[key], path, layer)
            out[f"model.layers.{i}.{suffix}"] = np.ascontiguousarray(to_hf(w))
    out["model.norm.weight"] = host["final_norm"]["scale"]
    if not config.tie_embeddings:
        out["lm_head.weight"] = np.ascontiguousarray(host["lm_head"].T)
    return out


def load_hf(path: str, **overrides: Any) -> tuple[LlamaConfig, dict]:
    """Reads a local Hugging Face LLaMA, Mistral, Qwen3, Gemma 2 or gpt-oss checkpoint directory ->
    (config, params as jax arrays).

    ``overrides`` replace config fields (e.g. ``dtype="bfloat16"``, ``scan_layers=False``).
    """
    with open(os.path.join(path, "config.json")) as f:
        try:
            hf = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{f.name} is not valid JSON: {e}") from e
    config = config_from_hf(hf, **overrides)
    params = params_from_hf(config, _read_dir(path), jnp.dtype(config.param_dtype))
    return config, jax.tree.map(jax.numpy.asarray, params)


def save_hf(
    config: LlamaConfig, params: Any, path: str, *, dtype: str | None = None, max_shard_bytes: int = 5 * 2**30
) -> None:
    """Writes config.json + safetensors (sharded with an index above ``max_shard_bytes``)."""
    dtype = dtype or config.param_dtype
    hf_config = config_to_hf(config, dtype)  # its ValueErrors before anything is written
    os.makedirs(path, exist_ok=True)
    tensors = params_to_hf(config, params, jnp.dtype(dtype))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2)
    shards, size = [{}], 0
    for name, x in tensors.items():
        if size and size + x.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = x
        size += x.nbytes
    if len(shards) == 1:
        write_safetensors(os.path.join(path, "model.safetensors"), shards[0])
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(os.path.join(path, fname), shard)
        weight_map.update({name: fname for name in shard})
    index = {"metadata": {"total_size": sum(x.nbytes for x in tensors.values())}, "weight_map": weight_map}
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
