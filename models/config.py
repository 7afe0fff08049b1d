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
REMAT_POLICIES = ("none", "full", "save_dots", "save_attn", "offload_attn")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """The llama3 ``rope_scaling`` (Llama 3.1 / 3.2): long wavelengths slowed down by ``factor``."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    rope_type: str = "llama3"

    def __post_init__(self):
        if self.rope_type != "llama3":
            raise ValueError(f"rope_type={self.rope_type!r}: only 'llama3' scaling is supported")
        if not self.factor > 0 or not self.high_freq_factor > self.low_freq_factor > 0:
            raise ValueError(f"bad llama3 rope scaling: {self.factor=} {self.low_freq_factor=} "
                             f"{self.high_freq_factor=}")


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """A LLaMA decoder. ``head_dim`` 0 means ``hidden_size // num_heads``. ``sliding_window`` W (Mistral):
    every layer's query at position i attends to the keys at i - W < j <= i only."""

    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 0
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False
    max_position_embeddings: int = 4096
    sliding_window: int | None = None  # None: full causal attention; W: the last W tokens (Mistral)
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
        if self.head_dim == 0 and self.num_heads > 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        self.validate()

    def validate(self) -> None:
        """Raises ValueError / TypeError on an inconsistent config (before anything is traced)."""
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "q_chunk", "kv_chunk"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by "
                             f"num_heads={self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not divisible by "
                             f"num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
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
        if window is not None and (isinstance(window, bool) or not isinstance(window, (int, np.integer))
                                   or not 1 <= window <= 2**31 - 1):
            raise ValueError(f"sliding_window={window!r} must be None or an int in [1, 2**31 - 1] "
                             "(positions are int32)")
        if not self.rope_theta > 0 or not self.rms_norm_eps > 0:
            raise ValueError(f"{self.rope_theta=} and {self.rms_norm_eps=} must be positive")

    @property
    def kv_groups(self) -> int:
        return self.num_heads // self.num_kv_heads


def _llama3(factor: float) -> RopeScaling:
    return RopeScaling(factor=factor, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=8192)


_LONG = dict(dtype="bfloat16", param_dtype="float32", remat="save_attn", scan_layers=True,
             loss_chunk=2048, mlp_chunk=None)

PRESETS: dict[str, LlamaConfig] = {
    # Tiny, CPU friendly, byte vocabulary.
    "debug": LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                         num_heads=4, num_kv_heads=2, max_position_embeddings=2048, loss_chunk=128),
    # Llama 3.2 1B / 3B (tied embeddings, llama3 scaling factor 32).
    "1b": LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
                      num_heads=32, num_kv_heads=8, head_dim=64, rope_theta=500000.0,
                      rope_scaling=_llama3(32.0), tie_embeddings=True,
                      max_position_embeddings=131072, **_LONG),
    "3b": LlamaConfig(vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_layers=28,
                      num_heads=24, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
                      rope_scaling=_llama3(32.0), tie_embeddings=True,
                      max_position_embeddings=131072, **_LONG),
    # Llama 2 7B (multi-head attention, no scaling).
    "7b": LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_layers=32,
                      num_heads=32, num_kv_heads=32, head_dim=128, rope_theta=10000.0,
                      max_position_embeddings=4096, **_LONG),
    # Llama 3.1 8B / 70B (untied, llama3 scaling factor 8).
    "8b": LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                      num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
                      rope_scaling=_llama3(8.0), max_position_embeddings=131072, **_LONG),
    "70b": LlamaConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_layers=80,
                       num_heads=64, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
                       rope_scaling=_llama3(8.0), max_position_embeddings=131072, **_LONG),
}


def get_config(name: str, **overrides) -> LlamaConfig:
    """A preset by name with fields replaced (e.g. ``get_config("1b", remat="save_dots")``)."""
    if name not in PRESETS:
        raise ValueError(f"config name={name!r} is not a preset; choose one of {tuple(PRESETS)}")
    unknown = set(overrides) - {f.name for f in dataclasses.fields(LlamaConfig)}
    if unknown:
        raise TypeError(f"unknown LlamaConfig fields {sorted(unknown)}; known fields: "
                        f"{', '.join(f.name for f in dataclasses.fields(LlamaConfig))}")
    return dataclasses.replace(PRESETS[name], **overrides)


def rope_inv_freq(config: LlamaConfig) -> np.ndarray:
    """RoPE inverse frequencies float32 [head_dim // 2], with llama3 scaling when configured."""
    d = config.head_dim
    inv = 1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    s = config.rope_scaling
    if s is None:
        return inv.astype(np.float32)
    wavelen = 2 * math.pi / inv
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor  # slowed fully above
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor  # kept below
    ramp = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    blended = (1 - ramp) * inv / s.factor + ramp * inv
    out = np.where(wavelen > low_wavelen, inv / s.factor, np.where(wavelen < high_wavelen, inv,
                                                                  blended))
    return out.astype(np.float32)


def num_params(config: LlamaConfig) -> int:
    """Number of trainable parameters (embedding, blocks, final norm, untied head)."""
    e, d = config.hidden_size, config.head_dim
    attn = e * d * (2 * config.num_heads + 2 * config.num_kv_heads)
    block = attn + 3 * e * config.intermediate_size + 2 * e
    head = 0 if config.tie_embeddings else e * config.vocab_size
    return config.vocab_size * e + config.num_layers * block + e + head
