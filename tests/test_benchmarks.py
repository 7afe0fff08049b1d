"""The benchmark scripts' CPU smoke modes (``--tiny``) run and write what they promise.

Speed is measured on the device, never here: these tests only keep the scripts from rotting.
"""

from __future__ import annotations

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
