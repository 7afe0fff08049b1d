"""Model FLOPs of a LLaMA batch, counted from its documents, and the peak rates MFU divides by.

MFU (model FLOPs utilisation, PaLM, Chowdhery et al. 2022) is the model's FLOPs per second over the
devices' peak. Model FLOPs here are the matmul FLOPs of the model's definition (2 per multiply-add;
training = forward + backward = 3x forward), whatever the implementation executes:

* matmuls: ``2 N`` per token forward, ``6 N`` training; ``N`` (:func:`matmul_params`) counts every
  weight matrix including the output projection (tied or not), not the embedding lookup.
* attention: per layer and query head, ``2 * (head_dim + v_head_dim)`` per visible (query, key)
  pair forward (``q.k`` over the q/k head dim, ``p.v`` over v's), 3x that training: ``4 * head_dim``
  and ``12 * head_dim`` where the two are equal. Only pairs the mask lets through count: with packed
  documents a query sees the keys of its own document (segment id) only, and a causal document of
  ``n`` tokens has ``n (n + 1) / 2`` pairs (:func:`attention_pairs`). Ring attention skips the other
  blocks, so counting them (as one ``seq_len``-token document per row would) overstates MFU.

:func:`flops_per_token` is the count for one document per row; :func:`batch_flops` counts a batch
from its segment ids on the host (numpy, any layout order: the count depends only on how many tokens
carry each id). Padding rows are a document of their own and count like one (the kernels compute
them).

Peak rates (:func:`peak_tflops`), one convention everywhere, as PaLM, MaxText, Megatron and TRL
use it: MFU = model FLOPs / (seconds x devices x the vendor's datasheet dense bf16 peak per device or
chip), never a measured rate, so H100 and H200 (the same tensor cores) divide by the same 989 TFLOP/s
and an MFU can be compared across devices and projects. ``source`` says where the peak came from
("datasheet"; "nominal" for CPUs, where MFU is only indicative; "config" for a given override;
"unknown", NaN, for a device not in :data:`PEAK_TFLOPS`). A measured matmul rate may be reported
beside MFU, named as such, never as a peak.
"""

from __future__ import annotations

import collections
import re
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from models.config import LlamaConfig


def matmul_params(config: LlamaConfig) -> int:
    """Weights that take part in a matmul per token: attention and MLP matrices of every layer and
    the output projection (``num_params`` minus the embedding lookup and the norms)."""
    e, d, dv = config.hidden_size, config.head_dim, config.v_dim
    attn = e * (config.num_heads + config.num_kv_heads) * (d + dv)  # wq, wk (d); wv, wo (dv)
    return config.num_layers * (attn + 3 * e * config.intermediate_size) + e * config.vocab_size


def _attention_flops(config: LlamaConfig, training: bool, pairs_of) -> int:
    """Attention FLOPs of every layer: per head and visible pair q.k (2 head_dim) and p.v (2
    v_head_dim), 3x training; ``pairs_of(window)`` counts the pairs under a layer's window (layers
    differ where ``config.layer_types`` says)."""
    per_pair = (3 if training else 1) * 2 * (config.head_dim + config.v_dim) * config.num_heads
    windows = collections.Counter(config.layer_window(i) for i in range(config.num_layers))
    return sum(layers * per_pair * int(pairs_of(w)) for w, layers in windows.items())


def segment_lengths(segment_ids: ArrayLike) -> np.ndarray:
    """Tokens per (row, segment id) of int segment ids [..., seq]: int64 [number of segments].

    Counts per id, so any reordering of a row (ring layouts) gives the same lengths; tokens that
    share an id see each other wherever they sit, and count as one document.
    """
    seg = np.asarray(segment_ids)
    if seg.ndim < 1 or seg.shape[-1] == 0 or not np.issubdtype(seg.dtype, np.integer):
        raise ValueError(
            f"segment_ids must be integers [..., seq] with seq > 0; got {seg.shape=} {seg.dtype=}"
        )
    rows = seg.reshape(-1, seg.shape[-1])
    if (np.diff(rows, axis=1) < 0).any():  # layout order: group equal ids (natural order is sorted)
        rows = np.sort(rows, axis=1)
    start = np.ones(rows.shape, bool)
    start[:, 1:] = rows[:, 1:] != rows[:, :-1]  # every row starts a segment of its own
    first = np.flatnonzero(start)
    return np.diff(np.append(first, rows.size)).astype(np.int64)


def document_pairs(n: ArrayLike, *, causal: bool = True, window: int | None = None) -> np.ndarray:
    """Visible (query, key) pairs of documents of ``n`` tokens (int64, elementwise): causal
    ``n (n + 1) / 2``, else ``n * n``; with a sliding window W (key j visible to query i only if
    ``|i - j| < W``) causal ``W (W + 1) / 2 + (n - W) W`` and otherwise ``n (2W - 1) - W (W - 1)``
    once ``n > W``."""
    n = np.asarray(n, np.int64)
    if window is None:
        return n * (n + 1) // 2 if causal else n * n
    w = np.int64(window)
    if causal:
        return np.where(n <= w, n * (n + 1) // 2, w * (w + 1) // 2 + (n - w) * w)
    return np.where(n <= w, n * n, n * (2 * w - 1) - w * (w - 1))


def attention_pairs(segment_ids: ArrayLike, *, causal: bool = True, window: int | None = None) -> int:
    """Visible (query, key) pairs of a batch (:func:`document_pairs` of every document, summed over
    documents and rows). Exact (a Python int)."""
    return int(document_pairs(segment_lengths(segment_ids), causal=causal, window=window).sum())


def batch_flops(
    config: LlamaConfig, segment_ids: ArrayLike, *, causal: bool = True, training: bool = True
) -> int:
    """Model FLOPs of a batch with int ``segment_ids`` [..., seq] (one id per row when nothing is
    packed): matmuls of every token plus attention over the visible pairs (within each layer's
    sliding window, ``config.layer_window``). Exact (a Python int)."""
    tokens = int(np.asarray(segment_ids).size)
    matmul = (6 if training else 2) * matmul_params(config) * tokens
    lengths = segment_lengths(segment_ids)
    pairs_of = lambda w: document_pairs(lengths, causal=causal, window=w).sum()  # noqa: E731
    return matmul + _attention_flops(config, training, pairs_of)


def flops_per_token(
    config: LlamaConfig, seq_len: int, *, causal: bool = True, training: bool = True
) -> float:
    """Training (or forward) FLOPs per token of rows that hold one ``seq_len``-token document:
    ``6 N`` plus ``6 * layers * heads * (head_dim + v_head_dim)`` times the pairs per token,
    ``(seq_len + 1) / 2`` when causal, ``seq_len`` when not (fewer within a layer's sliding
    window, :func:`document_pairs`). Equals :func:`batch_flops` per token of such a batch."""
    if not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
        raise ValueError(f"{seq_len=} must be a positive int")
    matmul = (6 if training else 2) * matmul_params(config)
    pairs_of = lambda w: document_pairs(seq_len, causal=causal, window=w)  # noqa: E731
    return float(matmul + _attention_flops(config, training, pairs_of) / seq_len)


class Peak(NamedTuple):
    tflops: float  # datasheet dense bf16 TFLOP/s per device (NaN when unknown)
    source: str  # "datasheet", "nominal" (CPU), "config" (an override) or "unknown"


# Datasheet dense (not 2:4 sparse) bf16 TFLOP/s per device (GPU) or chip (TPU), as MFU divides by.
# Each pattern is searched (re.search) in the lower-cased ``device.device_kind``; first match wins.
# Word boundaries keep "gh200" from matching "h200", "l40s" from "l4" and "gb200" from "b200"; kinds
# not listed give NaN ("unknown") rather than a neighbour's peak.
PEAK_TFLOPS = (
    (r"\bgh200\b", 989.0, "datasheet"),  # "NVIDIA GH200 480GB": the H100/H200 tensor cores
    (r"\bh200 nvl\b", 835.0, "datasheet"),  # "NVIDIA H200 NVL": lower clocks and power than SXM
    (r"\bh200\b", 989.0, "datasheet"),  # "NVIDIA H200": SXM, the H100 SXM's tensor cores
    (r"\bh100 nvl\b", 835.0, "datasheet"),  # "NVIDIA H100 NVL"
    (r"\bh100 pcie\b", 756.0, "datasheet"),  # "NVIDIA H100 PCIe"
    (r"\bh100\b", 989.0, "datasheet"),  # "NVIDIA H100 80GB HBM3" (SXM)
    (r"\ba100\b", 312.0, "datasheet"),  # "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB"
    (r"\bl4\b", 121.0, "datasheet"),  # "NVIDIA L4"
    (r"\bb200\b", 2250.0, "datasheet"),  # "NVIDIA B200"
    (r"\btpu v4$", 275.0, "datasheet"),  # "TPU v4" ("TPU v4 lite", v4i, is another chip)
    (r"\btpu v5( lite|e)$", 197.0, "datasheet"),  # v5e: "TPU v5 lite" (or "TPU v5e")
    (r"\btpu v5p?$", 459.0, "datasheet"),  # v5p: "TPU v5" (or "TPU v5p")
    (r"\btpu v6( lite|e)$", 918.0, "datasheet"),  # v6e (Trillium): "TPU v6 lite" (or "TPU v6e")
    (r"^cpu$", 0.1, "nominal"),  # MFU on a CPU is only indicative
)


def peak_tflops(device_kind: str, override: float = 0.0) -> Peak:
    """The datasheet peak MFU divides by: ``override`` if > 0 (``source`` "config"), else the
    :data:`PEAK_TFLOPS` entry whose pattern ``device_kind`` matches, else NaN ("unknown")."""
    if override > 0:
        return Peak(float(override), "config")
    kind = device_kind.strip().lower()
    for pattern, tflops, source in PEAK_TFLOPS:
        if re.search(pattern, kind):
            return Peak(tflops, source)
    return Peak(float("nan"), "unknown")


def mfu(model_flops: float, seconds: float, num_devices: int, peak: float) -> float:
    """Fraction of the devices' peak (TFLOP/s each) that ``model_flops`` in ``seconds`` use."""
    return model_flops / (seconds * num_devices * peak * 1e12)
