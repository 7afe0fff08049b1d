"""The benchmark scripts' CPU smoke modes (``--tiny``) run and write what they promise.

Speed is measured on the device, never here: these tests only keep the scripts from rotting.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys

import numpy as np
import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, BENCH)
    yield lambda name: importlib.import_module(name)
    sys.path.remove(BENCH)


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


# Records of 2026-11-29 counted a causal document's pairs as L^2 / 2, not L (L + 1) / 2: up to
# 2.2e-5 fewer FLOPs than models.flops counts now, which rounding of any quoted MFU never shows.
FLOP_COUNT_RTOL = 1e-4


def _mfu_records(tree, device: str = "", devices: int = 1):
    """(device, devices, record) for every dict of a result JSON that states an MFU or a peak."""
    if isinstance(tree, dict):
        device, devices = tree.get("device", device), tree.get("devices", devices)
        if "mfu" in tree or "peak_tflops" in tree:
            yield device, devices, tree
        for value in tree.values():
            yield from _mfu_records(value, device, devices)
    elif isinstance(tree, list):
        for value in tree:
            yield from _mfu_records(value, device, devices)


@pytest.mark.parametrize("name", ["model_1b_h200.json", "two_gpu_h200.json"])
def test_committed_mfu_divides_by_the_datasheet_peak(name):
    """Every MFU a committed model result states is its model FLOPs (counted by models.flops from
    the recorded tokens) over the recorded step seconds x devices x the device's datasheet peak, and
    below 1; every peak it stores is that datasheet peak."""
    from models import flops, llama

    with open(os.path.join(BENCH, "results", name)) as f:
        result = json.load(f)
    records = list(_mfu_records(result, result["provenance"]["device"]))
    assert sum("mfu" in r for _, _, r in records) >= 3
    config = llama.get_config("1b")
    for device, devices, r in records:
        peak = flops.peak_tflops(device.removeprefix("2 x "))
        assert peak.source == "datasheet", device
        if "peak_tflops" in r:
            assert r["peak_tflops"] == peak.tflops and r.get("peak_source", "datasheet") == "datasheet"
        if "mfu" in r:
            seconds = r.get("step_seconds", r.get("seconds"))
            counted = llama.flops_per_token(config, r["seq"]) * r["seq"]
            assert r.get("model_flops", counted) == counted
            assert r["mfu"] == pytest.approx(
                counted / (seconds * devices * peak.tflops * 1e12), rel=FLOP_COUNT_RTOL
            )
            assert 0 < r["mfu"] < 1


def test_profile_sums_trace_events_by_category(bench, tmp_path):
    out = str(tmp_path / "profile.json")
    summary = bench("profile_model").main(["--tiny", "--top", "5", "--out", out])
    assert summary["device_busy_s"] > 0 and len(summary["top_kernels"]) == 5
    total = sum(c["s"] for c in summary["categories"].values())
    assert total == pytest.approx(summary["device_busy_s"])
    assert json.load(open(out))["seq"] == 128


def test_attention_block_spec_keeps_pallas_hopper_defaults(bench):
    """``attention.py --block backward=mosaic``: string fields, over the head dim's defaults."""
    from ringattention.kernels.hopper import pallas_hopper as ph

    got = bench("attention").block_sizes_for("pallas_hopper", "backward=mosaic,bwd_stages=3", 128)
    assert got == dataclasses.replace(ph.default_block_sizes(128), backward="mosaic", bwd_stages=3)
    assert got.registers == 240


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


@pytest.mark.slow
def test_attention_deterministic_rows(bench, tmp_path):
    """``benchmarks/attention.py --deterministic`` times each implementation both ways."""
    out = str(tmp_path / "attn")
    rows = bench("attention").main(
        [
            "--impls",
            "xla",
            "--seqs",
            "128",
            "--causal",
            "1",
            "--shapes",
            "2:1:64",
            "--reps",
            "1",
            "--dtype",
            "float32",
            "--deterministic",
            "--out",
            out,
        ]
    )
    names = [r["name"] for r in rows]
    assert names == ["xla_sdpa", "ring[xla]", "ring[xla deterministic]"]
    assert all(r["fwdbwd_tflops"] > 0 and r["err_vs_f32_ref_prefix"] < 1e-5 for r in rows)
    assert json.load(open(out + ".json"))["rows"][2]["name"] == "ring[xla deterministic]"


def test_cp_bytes_hlo_matches_the_formula(bench, tmp_path):
    """``cp_bytes.py``: collective bytes of the compiled HLO equal the analytic formula."""
    cb = bench("cp_bytes")
    out = str(tmp_path / "cp")
    result = cb.main(["--tiny", "--devices", "4", "--seqs", "256,512", "--schemes", "hybrid", "--out", out])
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
        "all-to-all": 3 / 4 * 16 * 16 * (2 * 8 + 2 * 8) * 2,
        "collective-permute": 0,
    }


def test_cp_bytes_all_gather_matches_the_formula(bench, tmp_path):
    """The all-gather strategy: all-gathers forward, reduce-scatters of float32 dk/dv backward,
    each kind as the formula says and as ``ringattention.strategy.bytes_sent`` counts."""
    from ringattention import strategy

    cb = bench("cp_bytes")
    result = cb.main(
        [
            "--tiny",
            "--devices",
            "4",
            "--seqs",
            "256",
            "--schemes",
            "all_gather",
            "--out",
            str(tmp_path / "ag"),
        ]
    )
    (row,) = result["rows"]
    assert row["scheme"] == "all_gather" and row["hlo_matches"]
    hlo = row["hlo_f32"]
    assert hlo["fwd"]["all-gather"] > 0 and hlo["fwd"]["reduce-scatter"] == 0
    assert hlo["fwd_bwd"]["reduce-scatter"] > 0
    assert hlo["fwd_bwd"]["collective-permute"] == hlo["fwd_bwd"]["all-to-all"] == 0
    heads, kv_heads, dim = cb.TINY
    shape = strategy.Shape(1, 256, heads, kv_heads, dim, 4, dtype_bytes=4)
    assert strategy.bytes_sent(shape, "all_gather") == (
        cb.total(row["f32"]["fwd"]),
        cb.total(row["f32"]["fwd_bwd"]),
    )
    ring = cb.analytic(heads, kv_heads, dim, 256, 1, 4, 4)
    assert strategy.bytes_sent(shape, "ring") == (cb.total(ring["fwd"]), cb.total(ring["fwd_bwd"]))


def test_cp_bytes_reads_every_replica_group_format(bench):
    """The group size of a collective in each form XLA prints it: explicit groups, iota groups
    (jax 0.10-0.11) and mesh axes (jax 0.12, which the CPU CI does not run)."""
    size = bench("cp_bytes")._group_size
    assert size("x), replica_groups={{0,1,2},{3,4,5}}, dimensions={0}") == 3
    assert size("x), channel_id=1, replica_groups=[2,4]<=[8], dimensions={0}") == 4
    assert size("x), channel_id=1, replica_groups=mesh['sp'=2,'usp'=2] {'usp'}, metadata={}") == 2
    assert size("x), replica_groups=mesh['a'=2,'b'=3,'c'=4] {'a','c'}, dimensions={0}") == 8
    with pytest.raises(ValueError, match="replica groups"):
        size("x), replica_groups=mesh['a'=2] {'z'}, dimensions={0}")


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


def test_attention_times_a_ring_of_two_per_device(bench, tmp_path):
    """``attention.py --sp 1,2``: the ring of two runs on layout-ordered, sharded inputs, agrees with
    the baseline, and reports TFLOP/s per device."""
    out = str(tmp_path / "attn_sp")
    rows = bench("attention").main(
        [
            "--impls",
            "xla",
            "--seqs",
            "128",
            "--causal",
            "1",
            "--shapes",
            "2:1:64",
            "--reps",
            "1",
            "--dtype",
            "float32",
            "--sp",
            "1,2",
            "--out",
            out,
        ]
    )
    assert [(r["name"], r["devices"]) for r in rows] == [
        ("xla_sdpa", 1),
        ("ring[xla]", 1),
        ("ring[xla] sp=2 zigzag", 2),
    ]
    for r in rows:
        assert r["err_vs_baseline"] < 1e-5 and r["err_vs_f32_ref_prefix"] < 1e-5
        assert r["fwd_tflops"] == pytest.approx(4 * 2 * 128 * 128 * 64 / 2 / r["fwd_ms"] / 1e9 / r["devices"])


def test_determinism_gpu_ring_command(bench):
    """``determinism.py --gpus 2``: the runs train on a ring of two GPUs, one after another; a
    sequence the zigzag layout cannot split is refused."""
    det = bench("determinism")
    args = det.parse_args(["--gpus", "2", "--out", "/tmp/x"])
    assert "--mesh.sp=2" in det.train_args(args, "/tmp/run")
    assert "--mesh.sp=1" in det.train_args(det.parse_args(["--out", "/tmp/x"]), "/tmp/run")
    with pytest.raises(SystemExit):
        det.parse_args(["--gpus", "3", "--seq", "8192", "--out", "/tmp/x"])


def test_options_every_variant_is_exact_and_timed(bench, tmp_path):
    """``options.py --tiny``: each attention option against the plain ring, on CPU ("auto" is xla)."""
    out = str(tmp_path / "opt")
    result = bench("options").main(["--tiny", "--out", out])
    names = [r["variant"] for r in result["rows"]]
    assert names[0] == "plain" and {"sinks", "softcap 50", "check_vma=False"} <= set(names)
    assert all(
        r["max_abs_err"] < 1e-5 and r["fwd_tflops"] > 0 and r["fwdbwd_tflops"] > 0 for r in result["rows"]
    )
    assert json.load(open(out + ".json"))["rows"][0]["fwd_vs_plain"] == 1.0
    assert "| 0K | sinks | xla |" in open(out + ".md").read()
    again = str(tmp_path / "again")  # --render: the table again from the written timings
    bench("options").main(["--render", out + ".json", "--out", again])
    assert open(again + ".md").read() == open(out + ".md").read()


def test_options_time_forward_backward_as_one_forward_and_its_backward(bench, monkeypatch):
    """Forward+backward is one ``jax.vjp`` call, as in ``attention.py``: timing it runs the ring's
    forward once (not a forward call besides the vjp's own forward), so 3.5x the forward's FLOPs
    is the work timed."""
    import argparse

    import jax

    opt = bench("options")
    traced, timed = [], {}
    ring = opt.ra.ring_attention
    monkeypatch.setattr(opt.ra, "ring_attention", lambda *a, **kw: traced.append(1) or ring(*a, **kw))

    def time_once(fn, args, reps):  # one call of what is timed, with the ring's traces counted
        jax.clear_caches()
        del traced[:]
        jax.block_until_ready(fn(*args))
        timed[len(args)] = len(traced)
        return 1.0

    monkeypatch.setattr(opt.bench, "time_fn", time_once)
    args = argparse.Namespace(heads=4, kv_heads=2, head_dim=32, dtype="float32", reps=1, check_len=64)
    mesh = jax.sharding.Mesh(jax.devices()[:1], ("sp",))
    _, calls = opt._prepare("plain", {}, args, 128, mesh, {})
    assert opt.time_rounds(calls, 2, 1) == {"fwd": [1e3, 1e3], "fwdbwd": [1e3, 1e3]}
    assert timed == {3: 1, 4: 1}, timed  # forward: (q, k, v); forward+backward: (q, k, v, do)
    fwd, fwdbwd = (opt.variant_flops({}, 128, 4, 32, m) for m in ("fwd", "fwdbwd"))
    assert fwdbwd == pytest.approx(3.5 * fwd)  # what run() divides the (equal) times into


def test_options_interleave_the_rounds(bench, monkeypatch):
    """``time_rounds`` times every call once per round, round by round (not each call's rounds in
    a row), each round starting one call further on; ``run`` takes each call's median round, a
    variant's speed over plain's as the median of the rounds' ratios, and times plain's calls
    twice per round (the A/A ratio in the table)."""
    import argparse

    opt = bench("options")
    order = []
    monkeypatch.setattr(opt.bench, "time_fn", lambda fn, a, reps: order.append(fn) or fn())
    calls = {"a": (lambda: 1.0, ()), "b": (lambda: 2.0, ()), "c": (lambda: 3.0, ())}
    assert opt.time_rounds(calls, 4, 1) == {"a": [1e3] * 4, "b": [2e3] * 4, "c": [3e3] * 4}
    assert [f() for f in order] == [1.0, 2.0, 3.0, 2.0, 3.0, 1.0, 3.0, 1.0, 2.0, 1.0, 2.0, 3.0]
    rounds = {  # ms per round of each call run() hands to time_rounds
        ("plain", "fwd"): [3.0, 1.0, 2.0],
        ("plain", "fwdbwd"): [5.0, 5.0, 5.0],
        ("softcap 50", "fwd"): [6.0, 2.0, 2.0],
        ("softcap 50", "fwdbwd"): [6.0, 6.0, 6.0],
        (opt.AGAIN, "fwd"): [4.0, 2.0, 3.0],
        (opt.AGAIN, "fwdbwd"): [5.0, 5.0, 4.0],
    }
    seen = []

    def time_rounds(calls, n, reps):
        seen.append(list(calls))
        assert calls[(opt.AGAIN, "fwd")] is calls[("plain", "fwd")]  # the same call, timed twice
        return {key: rounds[key] for key in calls}

    monkeypatch.setattr(opt, "time_rounds", time_rounds)
    args = argparse.Namespace(
        seqs=[64],
        heads=2,
        kv_heads=1,
        head_dim=16,
        dtype="float32",
        reps=1,
        rounds=3,
        check_len=64,
        variants="softcap 50",
    )
    rows = opt.run(args)
    assert sorted(seen[0]) == sorted(rounds)
    assert [r["variant"] for r in rows] == ["plain", "softcap 50"]
    assert rows[0]["fwd_ms_rounds"] == [3.0, 1.0, 2.0] and rows[0]["fwd_ms"] == 2.0
    assert rows[1]["fwd_ms_rounds"] == [6.0, 2.0, 2.0] and rows[1]["fwd_ms"] == 2.0
    # speed over plain per round 0.5, 0.5, 1.0: their median, not the medians' ratio (1.0)
    assert rows[1]["fwd_vs_plain"] == pytest.approx(0.5) and rows[1]["fwdbwd_vs_plain"] == pytest.approx(
        5 / 6
    )
    # plain's time again over plain's per round: 4/3, 2, 1.5 (fwd) and 1, 1, 0.8 (fwd+bwd)
    assert rows[0]["again_fwd_vs_ours"] == pytest.approx(1.5)
    assert rows[0]["again_fwdbwd_vs_ours"] == pytest.approx(1.0)
    assert "again_fwd_vs_ours" not in rows[1]
    md = opt.table(rows)
    assert "Plain against itself at 0K" in md and "forward 1.50x, forward+backward 1.00x" in md


def test_options_count_the_pairs_each_mask_lets_through(bench):
    """``options.visible_pairs`` against ``masks.visible`` on every (query, key) pair of 64 tokens,
    for the plain causal mask, a prefix and the four bidirectional / causal documents."""
    import jax.numpy as jnp

    from ringattention import masks

    opt = bench("options")
    L = 64
    i = jnp.arange(L)
    seg = opt._segments(L)[0]
    cases = {
        "plain": ({}, {}),
        "prefix": (dict(prefix_length=L // 4), dict(prefix=jnp.full((1,), L // 4, jnp.int32))),
        "bidirectional": (
            dict(bidirectional_segments=True),
            dict(q_seg=seg[None], k_seg=seg[None], bidirectional=True),
        ),
    }
    for name, (opts, kw) in cases.items():
        q_seg, k_seg = kw.pop("q_seg", None), kw.pop("k_seg", None)
        vis = masks.visible(i, i, q_seg, k_seg, True, **kw)
        assert opt.visible_pairs(opts, L) == int(jnp.sum(vis)), name
    assert opt.variant_flops(dict(qk_dim=192), L, 2, 128, "fwd") == 2 * 2 * (L * (L + 1) // 2) * 320


def _png_size(path: str) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_plot_redraws_exactly_the_cited_charts_from_the_committed_results(bench, tmp_path):
    """``python benchmarks/plot.py`` redraws every chart in results/plots/ (each cited by a doc, each
    small) from the committed result files, every pallas_hopper record as one point."""
    plot = bench("plot")
    root = os.path.dirname(BENCH)
    written = plot.main(["--out", str(tmp_path)])
    committed = os.path.join(BENCH, "results", "plots")
    assert sorted(os.path.basename(p) for p in written) == sorted(os.listdir(committed))
    docs = [os.path.join(root, "README.md")] + [
        os.path.join(root, "docs", n) for n in os.listdir(os.path.join(root, "docs"))
    ]
    text = "".join(open(p).read() for p in docs if p.endswith(".md"))
    for path in written:
        name = os.path.basename(path)
        assert f"benchmarks/results/plots/{name}" in text, f"{name} is cited by no doc"
        assert os.path.getsize(os.path.join(committed, name)) < 150_000
        assert _png_size(path) == _png_size(os.path.join(committed, name))
    source = os.path.join(BENCH, "results", "pallas_hopper_h200.json")
    with open(source) as f:
        records = [
            r
            for section in json.load(f).values()
            if isinstance(section, dict)
            for r in section.get("records", [])
        ]
    expected = {
        (r["mode"], r["causal"], r["heads"], r["kv_heads"], r["head_dim"], r["seq"]): r["vs_cudnn"]
        for r in records
        if r.get("kind") == "time" and r["name"] == "pallas_hopper backward=default"
    }
    ratios = plot.plot_hopper_vs_cudnn(source, str(tmp_path / "again.png"))
    plotted = {
        (mode, causal, *shape, seq): v
        for (mode, causal), by_shape in ratios.items()
        for shape, pts in by_shape.items()
        for seq, v in pts
    }
    assert plotted == expected and {k[4] for k in plotted} == {64, 128, 256}
