"""The benchmark scripts' CPU smoke modes (``--tiny``, ``--cpu``) run and write what they promise: the
model-level scripts, ``inference.py``, ``model.py``, ``profile_model.py`` and ``determinism.py``.

Speed is measured on the device, never here: these tests only keep the scripts from rotting. What
the test_benchmarks_*.py files share: bench_cases.py.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from bench_cases import bench_fixture  # noqa: F401  (the bench fixture)


def test_inference_prefill_then_decode_from_a_synthetic_cache(bench, tmp_path):
    out = str(tmp_path / "inf")
    result = bench("inference").main(
        ["--tiny", "--contexts", "64,128", "--decode-only-from", "128", "--out", out]
    )
    first, second = result["rows"]
    assert first["prefill_tok_s"] > 0 and "synthetic_cache" not in first
    assert second["synthetic_cache"] and second["prefill_tok_s"] is None
    assert second["kv_bytes_per_device"] > first["kv_bytes_per_device"]
    assert all(r["decode_tok_s"] > 0 and r["baseline_decode_tok_s"] > 0 for r in result["rows"])
    assert json.load(open(out + ".json"))["rows"] == json.loads(json.dumps(result["rows"]))
    assert "not run" in open(out + ".md").read()


def test_model_compile_only_fit_reports_memory_without_running(bench, tmp_path):
    out = str(tmp_path / "model.json")
    result = bench("model").main(
        ["--tiny", "--seqs=", "--fit-seqs", "256,512", "--fit-compile-only", "--out", out]
    )
    assert result["throughput"] == [] and [r["seq"] for r in result["fit_rows"]] == [256, 512]
    fit = result["fit"]["longest"]
    assert fit["compiled_only"] and fit["seq"] == 512
    assert fit["needed_bytes"] >= fit["argument_size_in_bytes"] > 0
    assert result["attention_resolved"] == "xla"
    assert json.load(open(out))["fit"]["longest"]["seq"] == 512


def test_model_on_a_ring_of_two_reports_per_device_rates(bench, tmp_path):
    """``--sp 2``: the model on a ring of two virtual devices, timed rows and executed fit steps."""
    out = str(tmp_path / "model_sp2.json")
    result = bench("model").main(
        ["--tiny", "--sp", "2", "--remat", "save_attn", "--seqs", "64", "--fit-seqs", "256", "--out", out]
    )
    assert result["devices"] == 2 and result["config"]["layout"] == "zigzag"
    rows = result["throughput"] + [result["fit"]["longest"]]
    assert [r["seq"] for r in rows] == [64, 256]
    for r in rows:
        assert r["devices"] == 2 and r["step_seconds"] > 0
        assert r["tokens_per_s_per_device"] == pytest.approx(r["tokens_per_s"] / 2)
        peak = result["peak_tflops"] * 1e12
        assert r["mfu"] == pytest.approx(r["model_flops"] / r["step_seconds"] / (2 * peak))
    assert (result["peak_tflops"], result["peak_source"]) == (0.1, "nominal")  # CPU
    assert "datasheet" in result["mfu_definition"]
    assert result["fit"]["longest"]["train_step"] == "fwd+bwd+AdamW"
    assert np.isfinite(result["fit"]["longest"]["loss"])
    saved = json.load(open(out))
    assert [r["seq"] for r in saved["fit_rows"]] == [256] and saved["fit"]["remat"] == "save_attn"


def test_profile_sums_trace_events_by_category(bench, tmp_path):
    out = str(tmp_path / "profile.json")
    summary = bench("profile_model").main(["--tiny", "--top", "5", "--out", out])
    assert summary["device_busy_s"] > 0 and len(summary["top_kernels"]) == 5
    total = sum(c["s"] for c in summary["categories"].values())
    assert total == pytest.approx(summary["device_busy_s"])
    assert json.load(open(out))["seq"] == 128


def test_model_hopper_backward_flag_reaches_every_default(bench, monkeypatch):
    """``model.py --hopper_backward triton``: the step's defaults (called with ``v_head_dim``) and
    the deterministic hook's take that backward, every other field the head dim's default."""
    from ringattention.kernels.hopper import block_sizes, pallas_hopper

    plain = block_sizes.default_block_sizes
    for module in (block_sizes, pallas_hopper):
        monkeypatch.setattr(module, "default_block_sizes", module.default_block_sizes)
    bench("model")._use_hopper_backward("triton")
    got = pallas_hopper.default_block_sizes(192, True, v_head_dim=128)
    assert got == dataclasses.replace(plain(192, True, v_head_dim=128), backward="triton")
    assert pallas_hopper.deterministic_block_sizes(None, 128, True).backward == "triton"


@pytest.mark.slow
def test_determinism_script_smoke(bench, tmp_path):
    """``benchmarks/determinism.py --cpu``: four ``python -m train`` processes (two runs, a stop
    and a resume) on a ring of two CPU devices compare bitwise equal, with XLA's deterministic flag set."""
    out = str(tmp_path / "det")
    result = bench("determinism").main(["--cpu", "--steps", "2", "--stop", "1", "--out", out])
    assert result["passed"], result
    assert all(r["returncode"] == 0 and r["xla_deterministic_ops"] for r in result["runs"].values())
    assert result["steps_compared"] == [1, 2]
    assert {"loss", "grad_norm", "model_flops"} <= set(result["fields_compared"])
    assert json.load(open(out + ".json"))["passed"]


def test_determinism_gpu_ring_command(bench):
    """``determinism.py --gpus 2``: the runs train on a ring of two GPUs, one after another; a
    sequence the zigzag layout cannot split is refused."""
    det = bench("determinism")
    args = det.parse_args(["--gpus", "2", "--out", "/tmp/x"])
    assert "--mesh.sp=2" in det.train_args(args, "/tmp/run")
    assert "--mesh.sp=1" in det.train_args(det.parse_args(["--out", "/tmp/x"]), "/tmp/run")
    with pytest.raises(SystemExit):
        det.parse_args(["--gpus", "3", "--seq", "8192", "--out", "/tmp/x"])
