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


def test_cp_bytes_hlo_matches_the_formula(bench, tmp_path):
    """``cp_bytes.py``: collective bytes of the compiled HLO equal the analytic formula."""
    cb = bench("cp_bytes")
    out = str(tmp_path / "cp")
    result = cb.main(["--tiny", "--devices", "4", "--seqs", "256,512", "--schemes", "hybrid",
                      "--out", out])
    measured, longer = result["rows"]
    assert (measured["scheme"], measured["seq"], longer["seq"]) == ("hybrid 2x2", 256, 512)
    # measured at 256 tokens: each kind agrees exactly, no other collective is sent
    assert measured["hlo_matches"] and "hlo_f32" not in longer
    for key in ("fwd", "fwd_bwd"):
        hlo = measured["hlo_f32"][key]
        for kind in ("all-to-all", "collective-permute"):
            assert hlo[kind] == pytest.approx(measured["f32"][key][kind], rel=1e-12)
            assert hlo[kind] > 0
        assert hlo["all-gather"] == hlo["all-reduce"] == hlo["reduce-scatter"] == 0
    # the formula is linear in the length
    assert cb.total(longer["bf16"]["fwd_bwd"]) == 2 * cb.total(measured["bf16"]["fwd_bwd"])
    assert json.load(open(out + ".json"))["rows"][0]["scheme"] == "hybrid 2x2"
    assert "| yes |" in open(out + ".md").read()
    # bytes of a Ulysses group: q, k, v and o each send (U - 1) / U of themselves
    assert cb.analytic(8, 8, 16, 64, 4, 1, 2)["fwd"] == {
        "all-to-all": 3 / 4 * 16 * 16 * (2 * 8 + 2 * 8) * 2, "collective-permute": 0}


def test_cp_speed_times_ring_and_ulysses(bench, tmp_path):
    out = str(tmp_path / "speed")
    result = bench("cp_speed").main(["--tiny", "--devices", "2", "--out", out])
    ring, uly = result["rows"]  # every factorisation of 2 devices: ring of 2, Ulysses of 2
    assert (ring["scheme"], uly["scheme"]) == ("ring", "ulysses") and uly["ulysses"] == 2
    for r in (ring, uly):
        assert "error" not in r and r["fwd_ms"] > 0 and r["fwdbwd_tflops_per_device"] > 0
    assert uly["err_vs_first"] < 1e-2  # bfloat16 inputs, other summation orders
    assert json.load(open(out + ".json"))["rows"][1]["ulysses"] == 2
    with pytest.raises(ValueError, match="multiply"):
        bench("cp_speed").grids(bench("cp_speed").parse_args(["--grids", "2x3"]), 4)
