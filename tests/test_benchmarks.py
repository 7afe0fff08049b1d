"""The benchmark scripts' CPU smoke modes (``--tiny``) run and write what they promise.

Speed is measured on the device, never here: these tests only keep the scripts from rotting.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, BENCH)
    yield lambda name: importlib.import_module(name)
    sys.path.remove(BENCH)


def test_inference_prefill_then_decode_from_a_synthetic_cache(bench, tmp_path):
    out = str(tmp_path / "inf")
    result = bench("inference").main(["--tiny", "--contexts", "64,128", "--decode-only-from", "128",
                                      "--out", out])
    first, second = result["rows"]
    assert first["prefill_tok_s"] > 0 and "synthetic_cache" not in first
    assert second["synthetic_cache"] and second["prefill_tok_s"] is None
    assert second["kv_bytes_per_device"] > first["kv_bytes_per_device"]
    assert all(r["decode_tok_s"] > 0 and r["baseline_decode_tok_s"] > 0 for r in result["rows"])
    assert json.load(open(out + ".json"))["rows"] == json.loads(json.dumps(result["rows"]))
    assert "not run" in open(out + ".md").read()


def test_model_compile_only_fit_reports_memory_without_running(bench, tmp_path):
    out = str(tmp_path / "model.json")
    result = bench("model").main(["--tiny", "--fit-compile-only", "--out", out])
    fit = result["fit"]["longest"]
    assert fit["compiled_only"] and fit["seq"] == 512
    assert fit["needed_bytes"] >= fit["argument_size_in_bytes"] > 0
    assert result["attention_resolved"] == "xla"
    assert json.load(open(out))["fit"]["longest"]["seq"] == 512


def test_profile_sums_trace_events_by_category(bench, tmp_path):
    out = str(tmp_path / "profile.json")
    summary = bench("profile_model").main(["--tiny", "--top", "5", "--out", out])
    assert summary["device_busy_s"] > 0 and len(summary["top_kernels"]) == 5
    total = sum(c["s"] for c in summary["categories"].values())
    assert total == pytest.approx(summary["device_busy_s"])
    assert json.load(open(out))["seq"] == 128


def test_hopper_check_variants_become_block_sizes(bench):
    """``hopper_check.py --backwards`` entries: a backward name (or "default") plus BlockSizes fields."""
    hc = bench("hopper_check")
    from ringattention.kernels import pallas_hopper as ph

    assert hc.block_sizes("default", 128) == ph.default_block_sizes(128)
    got = hc.block_sizes("fused/bwd_block_k=128/registers=240", 64)
    want = dataclasses.replace(ph.default_block_sizes(64), backward="fused", bwd_block_k=128,
                               registers=240)
    assert got == want and got.stages == 3  # the head-dim-64 defaults underneath
    with pytest.raises(ValueError, match="backward"):
        hc.block_sizes("cuda", 128)
    with pytest.raises(ValueError, match="registers"):
        hc.block_sizes("fused/registers=250", 128)


def test_window_benchmark_times_window_and_full_causal(bench, tmp_path):
    """CPU smoke run: windowed rows at every length, full causal up to --full-max only."""
    window = bench("window")
    out = str(tmp_path / "window")
    result = window.main(["--tiny", "--full-max", "128", "--out", out])
    errs = result["err_vs_f32_reference_at_2W"]
    assert set(errs) == {"xla", "xla_sdpa"}
    assert all(e["ok"] and max(e[n] for n in ("o", "dq", "dk", "dv")) < 1e-5 for e in errs.values())
    rows = {(r["name"], r["seq"]): r for r in result["summary"]}
    assert set(rows) == {(n, s) for n in ("xla", "xla_sdpa") for s in (128, 256)}
    for (_, seq), r in rows.items():
        assert r["fwd_ms"] > 0 and r["fwdbwd_ms"] > 0
        assert r["ideal_speedup"] == window.pairs(seq, None) / window.pairs(seq, 32)
        measured = r["fwd_speedup"] is not None and r["fwdbwd_speedup"] is not None
        assert measured == (seq == 128)  # full causal beyond --full-max is not run
    skipped = [(r["name"], r["seq"]) for r in result["rows"] if "skipped" in r]
    assert skipped == [("xla", 256), ("xla_sdpa", 256)]
    assert json.load(open(out + ".json"))["summary"] == json.loads(json.dumps(result["summary"]))
    assert "not run (seq > --full-max 128)" in open(out + ".md").read()
