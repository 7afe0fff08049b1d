"""The Hugging Face config.json fields and tensor names of the families beyond LLaMA / Mistral:
Qwen3 (``Qwen3ForCausalLM``), Gemma 2 (``Gemma2ForCausalLM``) and gpt-oss (``GptOssForCausalLM``).

``models.hf`` reads the fields every family shares; this module adds each family's own (layer
types and windows, soft caps, experts, YaRN RoPE) and its per-layer tensors. gpt-oss checkpoints are read
in transformers' dequantized layout (``mlp.experts.gate_up_proj`` [experts, embed, 2 * mlp] with gate
and up interleaved), not the released MXFP4 ``*_blocks`` / ``*_scales`` tensors.
"""

from __future__ import annotations

from collections.abc import Callable

from einops import rearrange

from models.config import LlamaConfig, RopeScaling

MODEL_TYPES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gpt_oss": "gpt_oss",
}  # config.json model_type -> LlamaConfig.family
ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gpt_oss": "GptOssForCausalLM"}
_ALTERNATING = ("gemma2", "gpt_oss")  # default layer_types: layer i slides when i is even
Entry = tuple[str, tuple[str, ...], Callable, Callable]  # (hf suffix, our path, to ours, to hf)


def family_of(hf: dict) -> str:
    """LlamaConfig.family of a config.json (model_type; LLaMA when absent)."""
    kind = hf.get("model_type", "llama")
    if kind not in MODEL_TYPES:
        raise ValueError(f"model_type={kind!r} is not supported; choose one of {tuple(MODEL_TYPES)}")
    return MODEL_TYPES[kind]


def yarn_scaling(rope: dict, max_positions: int) -> RopeScaling:
    """RopeScaling(rope_type="yarn") from a rope_parameters / rope_scaling dict."""
    if rope.get("mscale") and rope.get("mscale_all_dim"):
        raise ValueError("yarn rope scaling with mscale / mscale_all_dim is not supported")
    orig = int(rope.get("original_max_position_embeddings") or max_positions)
    factor = rope.get("factor") or max_positions / orig
    return RopeScaling(
        rope_type="yarn",
        factor=float(factor),
        original_max_position_embeddings=orig,
        beta_fast=float(rope.get("beta_fast") or 32.0),
        beta_slow=float(rope.get("beta_slow") or 1.0),
        truncate=bool(rope.get("truncate", True)),
        attention_factor=rope.get("attention_factor"),
    )


def _windows(hf: dict, family: str) -> dict:
    """sliding_window and layer_types (None when every layer is alike)."""
    window = hf.get("sliding_window")
    if family == "qwen3" and not hf.get("use_sliding_window"):
        window = None
    n = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None and family in _ALTERNATING:
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    if types is None and family == "qwen3":
        first = hf.get("max_window_layers", n)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    if window is None or types is None or "sliding_attention" not in types:
        return {"sliding_window": None, "layer_types": None}
    if "full_attention" not in types:
        return {"sliding_window": int(window), "layer_types": None}
    return {"sliding_window": int(window), "layer_types": tuple(types)}


def family_fields(hf: dict, family: str) -> dict:
    """The LlamaConfig fields of a Qwen3 / Gemma 2 / gpt-oss config.json beyond LLaMA's."""
    out = {"family": family, **_windows(hf, family)}
    if family == "gemma2":
        act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"gemma2 hidden_activation={act!r} is not supported (only tanh GELU)")
        opt = lambda key: None if hf.get(key) is None else float(hf[key])  # noqa: E731
        out.update(
            query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
            attn_logit_softcap=opt("attn_logit_softcapping"),
            final_logit_softcap=opt("final_logit_softcapping"),
            tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        )
    if family == "gpt_oss":
        out.update(
            num_experts=int(hf["num_local_experts"]),
            experts_per_token=int(hf["num_experts_per_tok"]),
            swiglu_alpha=float(hf.get("swiglu_alpha", 1.702)),
            swiglu_limit=float(hf.get("swiglu_limit", 7.0)),
        )
        if not hf.get("attention_bias", True):
            raise ValueError("gpt_oss with attention_bias=false is not supported")
    elif hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ValueError(
            f"config.json has attention_bias / mlp_bias=true; {family} without biases is supported"
        )
    return out


def family_to_hf(config: LlamaConfig) -> dict:
    """The config.json fields of ``config.family`` (model_type, architectures, its options)."""
    f = config.family
    types = config.layer_types or [
        "sliding_attention" if config.layer_window(i) is not None else "full_attention"
        for i in range(config.num_layers)
    ]
    out = {
        "architectures": [ARCHITECTURES[f]],
        "model_type": f,
        "layer_types": list(types),
        "sliding_window": config.sliding_window,
        "attention_bias": f == "gpt_oss",
    }
    if f == "qwen3":
        out.update(use_sliding_window=config.sliding_window is not None, max_window_layers=0)
    if f == "gemma2":
        out.update(
            hidden_activation="gelu_pytorch_tanh",
            hidden_act="gelu_pytorch_tanh",
            query_pre_attn_scalar=_int_if_whole(config.query_pre_attn_scalar or config.head_dim),
            attn_logit_softcapping=config.attn_logit_softcap,
            final_logit_softcapping=config.final_logit_softcap,
        )
    if f == "gpt_oss":
        out.update(
            num_local_experts=config.num_experts,
            num_experts_per_tok=config.experts_per_token,
            swiglu_alpha=config.swiglu_alpha,
            swiglu_limit=config.swiglu_limit,
        )
    return out


def _int_if_whole(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x  # transformers' Gemma2Config wants an int


def yarn_to_hf(s: RopeScaling) -> dict:
    out = {
        "rope_type": "yarn",
        "factor": s.factor,
        "beta_fast": s.beta_fast,
        "beta_slow": s.beta_slow,
        "truncate": s.truncate,
        "original_max_position_embeddings": s.original_max_position_embeddings,
    }
    if s.attention_factor is not None:
        out["attention_factor"] = s.attention_factor
    return out


def _same(w):
    return w


def family_layer_map(config: LlamaConfig, entries: list[Entry]) -> list[Entry]:
    """LLaMA's per-layer ``entries`` changed for ``config.family``."""
    f, H, K = config.family, config.num_heads, config.num_kv_heads
    if f == "qwen3":
        return entries + [
            ("self_attn.q_norm.weight", ("attn", "q_norm", "scale"), _same, _same),
            ("self_attn.k_norm.weight", ("attn", "k_norm", "scale"), _same, _same),
        ]
    if f == "gemma2":
        renamed = {"post_attention_layernorm.weight": ("post_attn_norm", "scale")}
        return [(s, renamed.get(s, p), a, b) for s, p, a, b in entries] + [
            ("pre_feedforward_layernorm.weight", ("mlp_norm", "scale"), _same, _same),
            ("post_feedforward_layernorm.weight", ("post_mlp_norm", "scale"), _same, _same),
        ]
    if f != "gpt_oss":
        return entries
    heads = lambda n: (
        lambda w: rearrange(w, "(h d) -> h d", h=n),  # noqa: E731
        lambda w: rearrange(w, "h d -> (h d)"),
    )
    t = lambda w: w.T  # noqa: E731
    attn = [e for e in entries if not e[0].startswith("mlp.")]
    return attn + [
        ("self_attn.q_proj.bias", ("attn", "bq"), *heads(H)),
        ("self_attn.k_proj.bias", ("attn", "bk"), *heads(K)),
        ("self_attn.v_proj.bias", ("attn", "bv"), *heads(K)),
        ("self_attn.o_proj.bias", ("attn", "bo"), _same, _same),
        ("self_attn.sinks", ("attn", "sinks"), _same, _same),
        ("mlp.router.weight", ("mlp", "router"), t, t),  # [X, E] <-> [E, X]
        ("mlp.router.bias", ("mlp", "router_bias"), _same, _same),
        ("mlp.experts.gate_up_proj", ("mlp", "w_gate_up"), _same, _same),  # [X, E, 2F]
        ("mlp.experts.gate_up_proj_bias", ("mlp", "b_gate_up"), _same, _same),
        ("mlp.experts.down_proj", ("mlp", "w_down"), _same, _same),  # [X, F, E]
        ("mlp.experts.down_proj_bias", ("mlp", "b_down"), _same, _same),
    ]
