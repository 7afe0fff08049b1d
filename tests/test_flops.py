"""Model FLOPs counted from a batch's documents, and the one peak convention MFU divides by."""

from __future__ import annotations

import math
import re

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from models import flops, llama
from ringattention import layouts, masks

CONFIG = llama.get_config("1b")


def packed(rows: int, seq: int, doc_len: int) -> np.ndarray:
    """Segment ids of rows packed with documents of ``doc_len`` tokens (the last one cut)."""
    return np.broadcast_to(np.arange(seq) // doc_len + 1, (rows, seq)).astype(np.int32)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("seq", [1, 7, 64, 32768])
def test_one_document_per_row_is_flops_per_token(seq, causal):
    seg = np.ones((3, seq), np.int32)
    total = llama.batch_flops(CONFIG, seg, causal=causal)
    assert total / seg.size == llama.flops_per_token(CONFIG, seq, causal=causal)
    matmul = 6 * flops.matmul_params(CONFIG) * seg.size
    pairs = 3 * (seq * (seq + 1) // 2 if causal else seq * seq)
    assert total == matmul + 12 * CONFIG.num_layers * CONFIG.num_heads * CONFIG.head_dim * pairs


def test_short_packed_documents_count_fewer_flops_than_long_ones():
    seq = 65536
    per_token = {n: llama.batch_flops(CONFIG, packed(2, seq, n)) / (2 * seq) for n in (512, 4096, seq)}
    assert per_token[512] < per_token[4096] < per_token[seq] == llama.flops_per_token(CONFIG, seq)
    # the attention share shrinks with the documents: (n + 1) / 2 pairs per token
    attn = {n: v - 6 * flops.matmul_params(CONFIG) for n, v in per_token.items()}
    assert attn[512] == pytest.approx(attn[seq] * 513 / (seq + 1))


@pytest.mark.parametrize("causal", [True, False])
def test_pairs_are_the_visible_pairs_in_any_layout(causal):
    """attention_pairs equals the count of the elementwise mask (global positions, segment ids) and
    does not change when the rows are dealt into a ring layout."""
    rng = np.random.default_rng(0)
    seg = np.sort(rng.integers(0, 5, (3, 48)), axis=1).astype(np.int32)
    pos = jnp.arange(48, dtype=jnp.int32)
    vis = masks.visible(pos, pos, jnp.asarray(seg), jnp.asarray(seg), causal)
    chex.assert_shape(vis, (3, 48, 48))
    assert flops.attention_pairs(seg, causal=causal) == int(vis.sum())
    for layout in layouts.LAYOUTS:
        dealt = layouts.to_layout(seg, layout, 4)
        assert flops.attention_pairs(np.asarray(dealt), causal=causal) == int(vis.sum())


def test_flops_inputs_are_checked():
    with pytest.raises(ValueError, match="segment_ids"):
        flops.attention_pairs(np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match="seq_len"):
        llama.flops_per_token(CONFIG, 0)


# Datasheet dense bf16 TFLOP/s per device or chip, by the device_kind strings jax reports.
DATASHEET = {
    "NVIDIA H100 80GB HBM3": 989.0,
    "NVIDIA H200": 989.0,
    "NVIDIA GH200 480GB": 989.0,
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H100 NVL": 835.0,
    "NVIDIA H200 NVL": 835.0,
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-SXM4-40GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
    "NVIDIA B200": 2250.0,
    "NVIDIA L4": 121.0,
    "TPU v4": 275.0,
    "TPU v5 lite": 197.0,
    "TPU v5e": 197.0,
    "TPU v5": 459.0,
    "TPU v5p": 459.0,
    "TPU v6 lite": 918.0,
    "TPU v6e": 918.0,
}


@pytest.mark.parametrize("kind", sorted(DATASHEET))
def test_peak_is_the_datasheet_dense_bf16_peak(kind):
    assert flops.peak_tflops(kind) == (DATASHEET[kind], "datasheet")


def test_one_peak_convention():
    """MFU divides by the datasheet peak on every accelerator, never a measured rate: H100 and H200
    (the same tensor cores) give the same peak, and every entry but the CPU's is a datasheet one."""
    assert flops.peak_tflops("NVIDIA H200") == flops.peak_tflops("NVIDIA H100 80GB HBM3")
    assert {source for _, _, source in flops.PEAK_TFLOPS} == {"datasheet", "nominal"}
    assert [p for p, _, source in flops.PEAK_TFLOPS if source == "nominal"] == [r"^cpu$"]
    assert flops.peak_tflops("cpu") == (0.1, "nominal")
    # every table entry is exercised by a device kind above
    reached = {
        pattern
        for pattern, _, _ in flops.PEAK_TFLOPS
        for kind in [*DATASHEET, "cpu"]
        if re.search(pattern, kind.lower())
    }
    assert reached == {pattern for pattern, _, _ in flops.PEAK_TFLOPS}
    assert flops.peak_tflops("NVIDIA H200", override=500.0) == (500.0, "config")
    # neighbours' names never borrow a peak: unknown (NaN) instead
    for kind in ("NVIDIA L40S", "NVIDIA GB200", "TPU v4 lite", "unknown accelerator"):
        unknown = flops.peak_tflops(kind)
        assert math.isnan(unknown.tflops) and unknown.source == "unknown", kind
    # 1e12 FLOP in 1 s on one device of 2 TFLOP/s peak is half the peak
    assert flops.mfu(1e12, 1.0, 1, 2.0) == pytest.approx(0.5)


def test_each_layer_counts_its_window_and_both_head_dims():
    """Sliding and full layers (``layer_types``) each count their own pairs; a pair costs q.k over
    head_dim and p.v over v_head_dim; wv and wo are v_head_dim wide."""
    types = ("sliding_attention", "full_attention") * 2
    config = llama.get_config(
        "debug", num_layers=4, head_dim=32, v_head_dim=8, sliding_window=8, layer_types=types
    )
    seq, rows = 64, 2
    seg = np.ones((rows, seq), np.int32)
    e, h, k, f = config.hidden_size, config.num_heads, config.num_kv_heads, config.intermediate_size
    matmul = 4 * (e * (h + k) * (32 + 8) + 3 * e * f) + e * config.vocab_size
    assert flops.matmul_params(config) == matmul
    pairs = rows * 2 * (flops.document_pairs(seq, window=8) + flops.document_pairs(seq))
    total = llama.batch_flops(config, seg)
    assert total == 6 * matmul * seg.size + 6 * h * (32 + 8) * pairs
    assert total / seg.size == llama.flops_per_token(config, seq)
