"""Typed LLaMA configuration and presets (LLaMA 2 / 3 / 3.1 / 3.2 shapes).

LLaMA (Touvron et al. 2023), The Llama 3 Herd of Models (Grattafiori et al. 2024) for the shapes and
the llama3 RoPE frequency scaling; Mistral 7B (Jiang et al. 2023) for the sliding window; Ring
Attention (Liu et al. 2023) for the sequence-parallel options.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ringattention import implementations, layouts

DTYPES = ("float32", "bfloat16", "float16")
FAMILIES = ("llama", "qwen3", "gemma2", "gpt_oss")  # llama: LLaMA and Mistral (sliding_window)
LAYER_TYPES = ("full_attention", "sliding_attention")  # transformers' names
REMAT_POLICIES = ("none", "full", "save_dots", "save_attn", "offload_attn")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """The llama3 ``rope_scaling`` (Llama 3.1 / 3.2): long wavelengths slowed down by ``factor``;
    or ``rope_type="yarn"`` (YaRN, Peng et al. 2023, as transformers computes it for gpt-oss:
    ``beta_fast`` / ``beta_slow`` ramp, ``truncate``, cos/sin times ``attention_factor``, default
    ``0.1 ln(factor) + 1``)."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    rope_type: str = "llama3"
    beta_fast: float = 32.0  # yarn only
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None

    def __post_init__(self):
        if self.rope_type not in ("llama3", "yarn"):
            raise ValueError(f"rope_type={self.rope_type!r}: only 'llama3' and 'yarn' scaling are supported")
        if self.rope_type == "yarn":
            if not self.factor > 0 or not self.beta_fast > 0 or not self.beta_slow > 0:
                raise ValueError(f"bad yarn rope scaling: {self.factor=} {self.beta_fast=} {self.beta_slow=}")
        elif not self.factor > 0 or not self.high_freq_factor > self.low_freq_factor > 0:
            raise ValueError(
                f"bad llama3 rope scaling: {self.factor=} {self.low_freq_factor=} {self.high_freq_factor=}"
            )


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """A LLaMA decoder. ``head_dim`` 0 means ``hidden_size // num_heads``; ``v_head_dim`` gives v its
    own head dim (the output projection then takes ``num_heads * v_head_dim``): the attention shapes
    of DeepSeek-V2/V3's multi-head latent attention (q/k 192, v 128; DeepSeek-AI 2024), with plain
    projections in place of its low-rank ones. ``sliding_window`` W (Mistral):
    every layer's query at position i attends to the keys at i - W < j <= i only; with ``layer_types``
    only the "sliding_attention" layers do (Gemma 2, gpt-oss, Qwen3 with use_sliding_window).

    ``family`` picks the block structure (``docs/api.md``, "Model families"): "llama" (LLaMA,
    Mistral), "qwen3" (RMSNorm of q and k per head before RoPE), "gemma2" (embeddings times
    sqrt(hidden), RMSNorm times (1 + weight), post-attention and post-MLP norms, GeGLU MLP with
    tanh GELU) and "gpt_oss" (q/k/v/o biases, one attention-sink logit per head, a mixture of
    ``num_experts`` clamped-SwiGLU experts with ``experts_per_token`` routed per token)."""

    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 0
    v_head_dim: int | None = None  # v's own head dim (MLA shapes, DeepSeek-V2/V3); None: head_dim
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False
    max_position_embeddings: int = 4096
    sliding_window: int | None = None  # None: full causal attention; W: the last W tokens (Mistral)
    family: str = "llama"  # one of FAMILIES
    layer_types: tuple[str, ...] | None = None  # per layer, one of LAYER_TYPES; None: all alike
    query_pre_attn_scalar: float | None = None  # softmax scale qpas ** -0.5 (None: head_dim ** -0.5)
    attn_logit_softcap: float | None = None  # attention logits -> cap * tanh(logits / cap)
    final_logit_softcap: float | None = None  # LM-head logits -> cap * tanh(logits / cap)
    num_experts: int = 0  # gpt_oss: experts per MoE layer
    experts_per_token: int = 0  # gpt_oss: top-k
    swiglu_alpha: float = 1.702  # gpt_oss: glu = gate * sigmoid(alpha * gate)
    swiglu_limit: float = 7.0  # gpt_oss: gate <= limit, |up| <= limit
    dtype: str = "float32"  # compute dtype
    param_dtype: str = "float32"
    attention: str = "auto"  # a ringattention implementation name, "reference" (naive, tests) or
    # "cudnn" (one GPU, no packing: jax.nn.dot_product_attention's cuDNN kernel, a speed baseline)
    layout: str = "zigzag"  # ring layout when the mesh has sp > 1 (zigzag: balanced causal work)
    remat: str = "none"  # per-block rematerialisation policy, one of REMAT_POLICIES
    scan_layers: bool = True
    mlp_chunk: int | None = None  # tokens per blockwise_feedforward chunk (None: whole shard)
    loss_chunk: int | None = 1024  # tokens per cross-entropy chunk (None: plain, full logits)
    q_chunk: int = 1024  # ring inner-loop block sizes
    kv_chunk: int = 1024
    interpret: bool = False  # Pallas kernels in interpret mode (CPU tests)
    deterministic: bool = False  # ring attention kernels whose sums have a fixed order (bitwise
    # reproducible runs; on GPU also start with XLA_FLAGS=--xla_gpu_deterministic_ops=true)

    def __post_init__(self):
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        if isinstance(self.layer_types, list):  # e.g. from YAML
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.head_dim == 0 and self.num_heads > 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        self.validate()

    def validate(self) -> None:
        """Raises ValueError / TypeError on an inconsistent config (before anything is traced)."""
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "q_chunk",
            "kv_chunk",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not divisible by num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        v = self.v_head_dim
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
            raise ValueError(f"v_head_dim={v!r} must be None (= head_dim) or a positive int")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"{name}={getattr(self, name)!r}; choose one of {DTYPES}")
        layouts.check_layout(self.layout)
        attentions = (*implementations.names(), "reference", "cudnn")
        if self.attention not in attentions:
            raise ValueError(f"attention={self.attention!r} is not known; choose one of {attentions}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat={self.remat!r}; choose one of {REMAT_POLICIES}")
        for name in ("mlp_chunk", "loss_chunk"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}={value!r} must be None or a positive int")
        for name in ("deterministic", "interpret", "tie_embeddings", "scan_layers"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}={getattr(self, name)!r} must be a bool")
        window = self.sliding_window
        if window is not None and (
            isinstance(window, bool)
            or not isinstance(window, (int, np.integer))
            or not 1 <= window <= 2**31 - 1
        ):
            raise ValueError(
                f"sliding_window={window!r} must be None or an int in [1, 2**31 - 1] (positions are int32)"
            )
        if not self.rope_theta > 0 or not self.rms_norm_eps > 0:
            raise ValueError(f"{self.rope_theta=} and {self.rms_norm_eps=} must be positive")
        self._validate_family()

    def _validate_family(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family={self.family!r}; choose one of {FAMILIES}")
        types = self.layer_types
        if types is not None and (len(types) != self.num_layers or any(t not in LAYER_TYPES for t in types)):
            raise ValueError(
                f"layer_types={types!r} must be num_layers={self.num_layers} entries of {LAYER_TYPES}"
            )
        for name in ("query_pre_attn_scalar", "attn_logit_softcap", "final_logit_softcap"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name}={value!r} must be None or positive")
        moe = self.family == "gpt_oss"
        if (
            moe != (self.num_experts > 0)
            or not 0 <= self.experts_per_token <= self.num_experts
            or (moe and self.experts_per_token < 1)
        ):
            raise ValueError(
                f"num_experts={self.num_experts}, experts_per_token="
                f"{self.experts_per_token}: family 'gpt_oss' needs 1 <= "
                "experts_per_token <= num_experts, the other families num_experts=0"
            )

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of layer ``layer`` (None: full causal attention)."""
        if self.layer_types is None or self.layer_types[layer] == "sliding_attention":
            return self.sliding_window
        return None

    @property
    def layer_period(self) -> int:
        """The smallest p dividing num_layers with layer i's window == layer (i mod p)'s: the
        layers are scanned in groups of p (a static window per position in the group)."""
        windows = [self.layer_window(i) for i in range(self.num_layers)]
        return next(
            p
            for p in range(1, self.num_layers + 1)
            if self.num_layers % p == 0 and windows == windows[:p] * (self.num_layers // p)
        )

    @property
    def softmax_scale(self) -> float | None:
        """The attention softmax scale (None: ring attention's default head_dim ** -0.5)."""
        q = self.query_pre_attn_scalar
        return None if q is None else float(q) ** -0.5

    @property
    def v_dim(self) -> int:
        """The head dim of v and of the attention output (``v_head_dim``, else ``head_dim``)."""
        return self.head_dim if self.v_head_dim is None else int(self.v_head_dim)

    @property
    def kv_groups(self) -> int:
        return self.num_heads // self.num_kv_heads


def _llama3(factor: float) -> RopeScaling:
    return RopeScaling(
        factor=factor, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
    )


_LONG = dict(
    dtype="bfloat16",
    param_dtype="float32",
    remat="save_attn",
    scan_layers=True,
    loss_chunk=2048,
    mlp_chunk=None,
)

PRESETS: dict[str, LlamaConfig] = {
    # Tiny, CPU friendly, byte vocabulary.
    "debug": LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_position_embeddings=2048,
        loss_chunk=128,
    ),
    # Llama 3.2 1B / 3B (tied embeddings, llama3 scaling factor 32).
    "1b": LlamaConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        rope_theta=500000.0,
        rope_scaling=_llama3(32.0),
        tie_embeddings=True,
        max_position_embeddings=131072,
        **_LONG,
    ),
    "3b": LlamaConfig(
        vocab_size=128256,
        hidden_size=3072,
        intermediate_size=8192,
        num_layers=28,
        num_heads=24,
        num_kv_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        rope_scaling=_llama3(32.0),
        tie_embeddings=True,
        max_position_embeddings=131072,
        **_LONG,
    ),
    # Llama 2 7B (multi-head attention, no scaling).
    "7b": LlamaConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        head_dim=128,
        rope_theta=10000.0,
        max_position_embeddings=4096,
        **_LONG,
    ),
    # Llama 3.1 8B / 70B (untied, llama3 scaling factor 8).
    "8b": LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        rope_scaling=_llama3(8.0),
        max_position_embeddings=131072,
        **_LONG,
    ),
    "70b": LlamaConfig(
        vocab_size=128256,
        hidden_size=8192,
        intermediate_size=28672,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        rope_scaling=_llama3(8.0),
        max_position_embeddings=131072,
        **_LONG,
    ),
}


def get_config(name: str, **overrides) -> LlamaConfig:
    """A preset by name with fields replaced (e.g. ``get_config("1b", remat="save_dots")``)."""
    if name not in PRESETS:
        raise ValueError(f"config name={name!r} is not a preset; choose one of {tuple(PRESETS)}")
    unknown = set(overrides) - {f.name for f in dataclasses.fields(LlamaConfig)}
    if unknown:
        raise TypeError(
            f"unknown LlamaConfig fields {sorted(unknown)}; known fields: "
            f"{', '.join(f.name for f in dataclasses.fields(LlamaConfig))}"
        )
    return dataclasses.replace(PRESETS[name], **overrides)


def rope_inv_freq(config: LlamaConfig) -> np.ndarray:
    """RoPE inverse frequencies float32 [head_dim // 2], with llama3 or yarn scaling when configured."""
    d = config.head_dim
    inv = 1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    s = config.rope_scaling
    if s is None:
        return inv.astype(np.float32)
    if s.rope_type == "yarn":
        return _yarn_inv_freq(config, inv)
    wavelen = 2 * math.pi / inv
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor  # slowed fully above
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor  # kept below
    ramp = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    blended = (1 - ramp) * inv / s.factor + ramp * inv
    out = np.where(wavelen > low_wavelen, inv / s.factor, np.where(wavelen < high_wavelen, inv, blended))
    return out.astype(np.float32)


def _yarn_inv_freq(config: LlamaConfig, inv: np.ndarray) -> np.ndarray:
    """YaRN's blend of interpolated (inv / factor) and extrapolated (inv) frequencies, as
    transformers' ``_compute_yarn_parameters``."""
    s, d = config.rope_scaling, config.head_dim
    orig = s.original_max_position_embeddings
    corr = lambda rot: d * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(config.rope_theta))
    low, high = corr(s.beta_fast), corr(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    high = high + 0.001 if low == high else high
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolate = 1 - ramp  # [head_dim // 2], 1: keep the original frequency
    return (inv / s.factor * (1 - extrapolate) + inv * extrapolate).astype(np.float32)


def rope_attention_factor(config: LlamaConfig) -> float:
    """The factor cos/sin are multiplied by (YaRN's attention scaling; 1 otherwise)."""
    s = config.rope_scaling
    if s is None or s.rope_type != "yarn":
        return 1.0
    if s.attention_factor is not None:
        return float(s.attention_factor)
    return 1.0 if s.factor <= 1 else 0.1 * math.log(s.factor) + 1.0


def num_params(config: LlamaConfig) -> int:
    """Number of trainable parameters (embedding, blocks, final norm, untied head); for gpt_oss
    every expert counts (total, not active, parameters)."""
    e, d, dv, f = config.hidden_size, config.head_dim, config.v_dim, config.intermediate_size
    h, k, x = config.num_heads, config.num_kv_heads, config.num_experts
    attn = e * (h + k) * (d + dv)  # wq, wk (d), wv, wo (dv)
    block = attn + 3 * e * f + 2 * e
    if config.family == "qwen3":
        block += 2 * d  # q_norm, k_norm
    elif config.family == "gemma2":
        block += 2 * e  # post-attention and post-MLP norms
    elif config.family == "gpt_oss":  # biases, sinks, router, experts instead of one MLP
        block += (h + k) * d + k * dv + e + h + (e + 1) * x + x * (3 * e * f + 2 * f + e) - 3 * e * f
    head = 0 if config.tie_embeddings else e * config.vocab_size
    return config.vocab_size * e + config.num_layers * block + e + head
