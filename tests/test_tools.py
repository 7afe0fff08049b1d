"""The kernel-development tools of ``tools/`` (device check and timing harness, its table, profiles,
AOT compile and SASS reading) parse and build what they promise, on CPU.

Speed is measured on the device, never here: these tests only keep the scripts from rotting.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import importlib
import json
import os
import sys

import numpy as np
import pytest

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, TOOLS)
    yield lambda name: importlib.import_module(name)
    sys.path.remove(TOOLS)


def test_hopper_check_variants_become_block_sizes(bench):
    """``hopper_check.py --backwards`` entries: a backward name (or "default") plus BlockSizes fields."""
    hr = bench("hopper_run")
    from ringattention.kernels.hopper import pallas_hopper as ph

    assert hr.block_sizes("default", 128) == ph.default_block_sizes(128)
    got = hr.block_sizes("fused/bwd_block_k=128/registers=240", 64)
    want = dataclasses.replace(ph.default_block_sizes(64), backward="fused", bwd_block_k=128, registers=240)
    assert got == want and got.schedule == "pingpong3"  # the head-dim-64 defaults underneath
    assert hr.block_sizes("default/split_group=false", 128).split_group is False  # not the string
    full = hr.block_sizes("default", 128, causal=False)  # the forward schedule follows the mask
    assert full == ph.default_block_sizes(128, causal=False) and full.schedule == "overlap"
    assert hr.block_sizes("default/schedule=pingpong3", 128, causal=False) == hr.block_sizes("default", 128)
    for d, causal in ((64, True), (64, False), (128, True), (128, False), (256, True)):
        assert hr.block_sizes("deterministic", d, causal) == ph.deterministic_block_sizes(
            None, d, causal
        )  # what deterministic=True runs
    got = hr.block_sizes("deterministic/bwd_stages=3", 128, causal=False)
    assert (got.backward, got.bwd_stages, got.schedule) == ("mosaic", 3, "overlap")
    assert hr.block_sizes("deterministic", 64).bwd_block_k == 128  # its own dq tiles at 64
    mla = hr.block_sizes("default", 192, v_head_dim=128)  # MLA's defaults: the fused backward
    assert mla == ph.default_block_sizes(192, v_head_dim=128) and mla.backward == "fused"
    with pytest.raises(ValueError, match="backward"):
        hr.block_sizes("cuda", 128)
    with pytest.raises(ValueError, match="registers"):
        hr.block_sizes("fused/registers=250", 128)


def test_hopper_check_skips_duplicate_and_unfit_backwards(bench, monkeypatch):
    """``--backwards default,mosaic,fused``: at head dims 64 and 128 "default" is "fused", at 256
    "mosaic" (each timed once); "fused" applies at head dims <= 128 only: each skip is a note
    line."""
    hr, hb, hc = (bench(n) for n in ("hopper_run", "hopper_bench", "hopper_check"))
    monkeypatch.setattr(hr, "BACKWARDS", ["default", "mosaic", "fused"])
    monkeypatch.setattr(hr, "write_out", lambda: None)
    assert [name for name, _ in hr.distinct_backwards(64)] == ["default", "mosaic"]
    assert [name for name, _ in hr.distinct_backwards(128)] == ["default", "mosaic"]
    assert [(name, bs.backward) for name, bs in hr.distinct_backwards(256)] == [("default", "mosaic")]
    assert any("is backward=default" in line for line in hr.LINES)
    assert any("applies at head dims <= 128 only" in line for line in hr.LINES)
    monkeypatch.setattr(hr, "BACKWARDS", ["default", "default/schedule=overlap"])
    assert [n for n, _ in hr.distinct_backwards(128)] == hr.BACKWARDS  # causal: two forwards
    assert [n for n, _ in hr.distinct_backwards(128, causal=False)] == ["default"]  # the same
    monkeypatch.setattr(hr, "BACKWARDS", ["default", "fused", "fused/bwd_stages=3", "mosaic/bwd_stages=3"])
    assert [n for n, _ in hr.distinct_backwards(128)] == [
        "default",
        "fused/bwd_stages=3",
        "mosaic/bwd_stages=3",
    ]
    assert [n for n, _ in hr.distinct_backwards(256)] == ["default", "mosaic/bwd_stages=3"]
    monkeypatch.setattr(hr, "BACKWARDS", ["default", "default/split_group=true"])
    fns = hb.timed_variants(128, False)  # split_group is the backward's: one forward timed
    assert [fwd is None for fwd, _ in fns.values()] == [False, True]
    assert hc.parse_shapes("32:8:128@65536,16:16:256", [1, 2]) == [
        (32, 8, 128, [65536]),
        (16, 16, 256, [1, 2]),
    ]


def test_hopper_check_bench_times_gqa_shapes(bench, monkeypatch):
    """The bench loop over a heads:kv_heads:head_dim shape, with XLA attention standing in for
    cuDNN and the kernels (CPU): one record per function and mode, ratios against the first."""
    import jax
    import jax.numpy as jnp

    hr, hb = bench("hopper_run"), bench("hopper_bench")

    def xla_fns(*_, **__):
        fwd = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True))
        return fwd, jax.jit(
            lambda q, k, v, do: jax.grad(lambda q: jnp.sum(fwd(q, k, v).astype(jnp.float32) * do))(q)
        )

    monkeypatch.setattr(hb, "cudnn_fns", xla_fns)
    monkeypatch.setattr(hb, "step_fns", xla_fns)
    # at 256 "mosaic" is "default" and "fused" does not apply
    monkeypatch.setattr(hr, "BACKWARDS", ["default", "mosaic", "fused", "mosaic/bwd_stages=3"])
    monkeypatch.setattr(hb, "REPS", {"n": 1, "min_ms": 0.0})
    monkeypatch.setattr(hr, "RECORDS", [])
    monkeypatch.setattr(hr, "write_out", lambda: None)
    hb.bench(64, True, 4, 2, 256)
    times = [r for r in hr.RECORDS if r["kind"] == "time"]
    assert [(r["name"], r["mode"]) for r in times] == [
        ("cudnn", "fwd"),
        ("cudnn", "fwdbwd"),
        ("pallas_hopper backward=default", "fwd"),
        ("pallas_hopper backward=default", "fwdbwd"),
        ("pallas_hopper backward=mosaic/bwd_stages=3", "fwdbwd"),
    ]
    assert all((r["heads"], r["kv_heads"], r["head_dim"]) == (4, 2, 256) for r in times)
    assert times[0]["vs_cudnn"] == 1.0 and times[2]["vs_cudnn"] > 0


def test_hopper_check_rounds_interleave_and_pair_the_ratios(bench, monkeypatch):
    """``--rounds 3``: three passes over cuDNN and the variant (compiled once), each pass on record;
    the time is the median over passes and the ratio the median of each pass's own ratio. Fake
    clocks: the variant takes 2, 3, 5 s while cuDNN takes 1, 3, 4 s (per-pass ratios 0.5, 1.0,
    0.8; the ratio of the medians would be 1.0)."""
    hr, hb = bench("hopper_run"), bench("hopper_bench")
    seconds = {"cudnn": iter([1.0, 3.0, 4.0]), "v": iter([2.0, 3.0, 5.0])}
    calls = []

    def fake_time_fn(fn, args, compiled=False):
        calls.append((fn, compiled))
        return next(seconds[fn])

    monkeypatch.setattr(hb, "cudnn_fns", lambda causal: (None, "cudnn"))
    monkeypatch.setattr(hb, "timed_variants", lambda d, causal: {"v": (None, "v")})
    monkeypatch.setattr(hr, "BACKWARDS", ["default"])  # no Triton step next to them
    monkeypatch.setattr(hb, "time_fn", fake_time_fn)
    monkeypatch.setattr(hb, "ROUNDS", {"n": 3})
    monkeypatch.setattr(hr, "RECORDS", [])
    monkeypatch.setattr(hr, "write_out", lambda: None)
    hb.bench(16, True, 2, 1, 64)
    assert calls == [
        ("cudnn", False),
        ("v", False),
        ("cudnn", True),
        ("v", True),
        ("cudnn", True),
        ("v", True),
    ]
    assert [r["kind"] for r in hr.RECORDS] == ["time_round"] * 3 + ["time"] * 2
    cudnn, v = hr.RECORDS[3:]
    assert (cudnn["name"], cudnn["ms"], cudnn["vs_cudnn"], cudnn["rounds"]) == ("cudnn", 3000.0, 1.0, 3)
    assert (v["name"], v["ms"], v["vs_cudnn"], v["rounds"]) == ("v", 3000.0, 0.8, 3)
    assert v["vs_cudnn_passes"] == [0.5, 1.0, 0.8]  # each pass's own, for hopper_table --spread
    assert v["tflops"] == pytest.approx(hb.flops(2, 16, 64, True, "fwdbwd") / 3.0 / 1e12)


def test_hopper_check_repeat_counts_distinct_results(bench, monkeypatch):
    """``--parts repeat``: five runs per backward, distinct results counted bit for bit. A backward
    with a fixed order of its sums (here "mosaic", the two-kernel one) PASSes with one result and
    FAILs with two; the fused one (reduce-adds in run order) is reported either way. Fake steps on
    CPU: one returns the same arrays every call, the other a different dq on its second call."""
    import numpy as np

    hr, hb = bench("hopper_run"), bench("hopper_bench")
    calls = {"n": 0, "flaky": False}

    def step_fns(mod, causal, bs):
        def fwdbwd(q, k, v, do):
            calls["n"] += 1
            unstable = bs.backward == "fused" or calls["flaky"]
            wobble = 1e-7 if unstable and calls["n"] % 5 == 2 else 0.0
            return np.float32(1.0 + wobble) * np.ones(3, np.float32), np.zeros(2), np.zeros(2)

        return None, fwdbwd

    monkeypatch.setattr(hb, "step_fns", step_fns)
    monkeypatch.setattr(hr, "BACKWARDS", ["mosaic", "fused"])
    monkeypatch.setattr(hr, "RECORDS", [])
    monkeypatch.setattr(hr, "write_out", lambda: None)
    for flaky in (False, True):
        calls.update(n=0, flaky=flaky)
        hb.repeat(64, True, 2, 1, 64)
    got = [(r["backward"], r["distinct"], r["passed"]) for r in hr.RECORDS if r["kind"] == "repeat"]
    assert got == [("mosaic", 1, True), ("fused", 2, None), ("mosaic", 2, False), ("fused", 2, None)]
    assert hb.fixed_order(hr.block_sizes("deterministic", 128))
    assert not hb.fixed_order(hr.block_sizes("default", 128))


def test_hopper_check_repeats_cudnn_both_ways(bench, monkeypatch):
    """``--cudnn-deterministic``: the repeats also run cuDNN's backward and its deterministic one
    (XLA's xla_gpu_deterministic_ops); only the latter claims a fixed order (PASS / FAIL), the
    former is reported. Fakes on CPU: the default cuDNN one wobbles, the deterministic one not."""
    import numpy as np

    hr, hb = bench("hopper_run"), bench("hopper_bench")
    calls = {"n": 0}

    def grad(wobbly):
        def fn(q, k, v, do):
            calls["n"] += 1
            wobble = 1e-7 if wobbly and calls["n"] % 5 == 2 else 0.0
            return (np.float32(1.0 + wobble) * np.ones(3, np.float32),)

        return fn

    monkeypatch.setattr(hb, "cudnn_fns", lambda causal: (None, grad(True)))
    monkeypatch.setattr(hb, "cudnn_deterministic_grad", lambda causal, args: grad(False))
    monkeypatch.setattr(hr, "BACKWARDS", [])
    monkeypatch.setattr(hb, "CUDNN_DET", {"on": True})
    monkeypatch.setattr(hr, "RECORDS", [])
    monkeypatch.setattr(hr, "write_out", lambda: None)
    hb.repeat(64, True, 2, 1, 64)
    got = [(r["backward"], r["distinct"], r["passed"]) for r in hr.RECORDS if r["kind"] == "repeat"]
    assert got == [("cudnn", 2, None), ("cudnn deterministic", 1, True)]


def test_hopper_check_command_line_reaches_the_timing(bench, monkeypatch, tmp_path):
    """``hopper_check.py``'s options set the one copy of the state that ``hopper_bench`` and
    ``hopper_run`` read: --reps, --min-ms, --rounds, --cudnn-deterministic, --backwards, --out and
    --hard-limit (the time budget) as a fake ``bench`` sees them, and the output file written."""
    hr, hb, hc = (bench(n) for n in ("hopper_run", "hopper_bench", "hopper_check"))
    fresh = {"BACKWARDS": [], "OUT": {"prefix": "unset"}, "LINES": [], "RECORDS": [], "BUDGET_S": 250.0}
    for name, value in fresh.items():
        monkeypatch.setattr(hr, name, value)
    for name, value in (
        ("REPS", {"n": 5, "min_ms": 0.0}),
        ("ROUNDS", {"n": 1}),
        ("CUDNN_DET", {"on": False}),
    ):
        monkeypatch.setattr(hb, name, value)
    monkeypatch.setattr(hc, "INTERPRET", {"on": False})
    seen = []

    def fake_bench(*args):
        seen.append((args, hb.REPS, hb.ROUNDS, hb.CUDNN_DET, hr.BACKWARDS, hr.BUDGET_S))

    monkeypatch.setattr(hb, "bench", fake_bench)
    out = tmp_path / "run"
    argv = "--parts bench --shapes 4:2:64@256 --reps 3 --min-ms 50 --rounds 2 --cudnn-deterministic"
    argv += f" --backwards default,mosaic/bwd_stages=3 --out {out} --hard-limit 100000"
    monkeypatch.setattr(sys, "argv", ["hopper_check.py", *argv.split()])
    hc.main()
    assert seen == [
        (
            (256, True, 4, 2, 64),
            {"n": 3, "min_ms": 50.0},
            {"n": 2},
            {"on": True},
            ["default", "mosaic/bwd_stages=3"],
            100000 - (hr.HARD_LIMIT_S - 250.0),
        )
    ]
    assert json.loads(out.with_suffix(".json").read_text())["lines"][-1].startswith("SUMMARY pass=0")


def test_hopper_table_rows_per_problem_later_files_win(bench, tmp_path):
    """``hopper_table.py``: a row per (shape, tokens, mask) of hopper_check outputs, a column per
    (variant, mode); a later file's record of the same cell replaces the earlier one, cuDNN's own
    records are left out, a cell never timed is "-", and no records at all is a ValueError."""

    def record(name, mode, ratio, seq=65536, causal=True, kvh=8, rounds=3):
        return dict(
            kind="time",
            name=name,
            mode=mode,
            vs_cudnn=ratio,
            rounds=rounds,
            seq=seq,
            heads=32,
            kv_heads=kvh,
            head_dim=128,
            causal=causal,
        )

    first = [
        record("cudnn", "fwdbwd", 1.0),
        record("pallas_hopper backward=default", "fwd", 1.01),
        record("pallas_hopper backward=default", "fwdbwd", 0.90),
        record("pallas_hopper backward=default", "fwdbwd", 0.97, causal=False, rounds=1),
    ]
    second = [
        record("pallas_hopper backward=default", "fwdbwd", 0.96),
        record("pallas_hopper backward=deterministic", "fwdbwd", 0.93),
    ]
    paths = []
    for i, records in enumerate((first, second)):
        paths.append(str(tmp_path / f"r{i}.json"))
        json.dump(dict(lines=[], records=records + [dict(kind="note")]), open(paths[-1], "w"))
    text = bench("hopper_table").main(paths)
    header, _, causal, full = text.splitlines()
    assert header == (
        "| shape | tokens | mask | default fwd | default fwdbwd | deterministic fwdbwd | rounds |"
    )
    assert causal == "| 32:8:128 | 64K | causal | 1.01x | 0.96x | 0.93x | 3 |"
    assert full == "| 32:8:128 | 64K | full | - | 0.97x | - | 1 |"
    json.dump(dict(lines=[], records=first[:1]), open(paths[0], "w"))
    with pytest.raises(ValueError, match="no 'time' records"):
        bench("hopper_table").main(paths[:1])


def test_hopper_table_spread_of_the_passes(bench, tmp_path):
    """``hopper_table.py --spread``: each cell with the lowest and highest of its passes' own
    ratios, from the records' ``vs_cudnn_passes`` or, in older files, from the ``time_round``
    records before each problem's ``time`` records (their ms, cuDNN's over the variant's)."""

    def problem(causal, rounds, passes=None):
        meta = dict(seq=16384, heads=32, kv_heads=32, head_dim=128, causal=causal)
        ratio = sorted(rd["cudnn fwdbwd"] / rd["v fwdbwd"] for rd in rounds)[len(rounds) // 2]
        timed = dict(kind="time", name="v", mode="fwdbwd", vs_cudnn=ratio, rounds=len(rounds), **meta)
        if passes is not None:
            timed["vs_cudnn_passes"] = passes
        return [dict(kind="time_round", label="L=16384 32:32:128", ms=rd) for rd in rounds] + [
            dict(kind="time", name="cudnn", mode="fwdbwd", vs_cudnn=1.0, rounds=3, **meta),
            timed,
        ]

    old_file = problem(
        True,
        [
            {"cudnn fwdbwd": 14.5, "v fwdbwd": 15.0},
            {"cudnn fwdbwd": 14.5, "v fwdbwd": 14.5},
            {"cudnn fwdbwd": 13.0, "v fwdbwd": 13.0 / 0.9},
        ],
    )
    old_file += problem(
        False, [{"cudnn fwdbwd": 28.0, "v fwdbwd": 28.0}, {"cudnn fwdbwd": 28.0, "v fwdbwd": 35.0}]
    )
    path = tmp_path / "grid.json"
    json.dump(dict(lines=[], records=old_file), open(path, "w"))
    rows = bench("hopper_table").main(["--spread", str(path)]).splitlines()[2:]
    assert rows == [
        "| 32:32:128 | 16K | causal | 0.97x (0.90-1.00) | 3 |",
        "| 32:32:128 | 16K | full | 1.00x (0.80-1.00) | 2 |",
    ]
    new_file = problem(True, [{"cudnn fwdbwd": 1.0, "v fwdbwd": 1.0}] * 3, passes=[0.93, 1.0, 0.95])
    json.dump(dict(lines=[], records=new_file), open(path, "w"))
    assert bench("hopper_table").main(["--spread", str(path)]).splitlines()[2] == (
        "| 32:32:128 | 16K | causal | 1.00x (0.93-1.00) | 3 |"
    )
    assert bench("hopper_table").main([str(path)]).splitlines()[2] == (
        "| 32:32:128 | 16K | causal | 1.00x | 3 |"
    )  # without --spread, as before


def test_hopper_profile_durations_per_kernel(bench, tmp_path):
    """``hopper_profile.py --durations``: each kernel's Duration from an ncu details CSV (plain or
    gzipped) in launch order, converted to microseconds, other metrics ignored; no Duration rows or
    an unknown unit are ValueErrors."""
    hp = bench("hopper_profile")
    head = ["ID", "Kernel Name", "Grid Size", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
    rows = [
        ["0", "loop_broadcast_fusion", "(131072, 1, 1)", "SOL", "Duration", "usecond", "81.25"],
        ["0", "loop_broadcast_fusion", "(131072, 1, 1)", "SOL", "SM Frequency", "Ghz", "1.96"],
        ["1", "scoped_mosaic_gpu_kernel", "(1, 128, 32)", "SOL", "Duration", "msecond", "9.57"],
        ["2", "convert_dq", "(1024, 1, 32)", "SOL", "Duration", "ns", "103,040"],
    ]
    path = tmp_path / "k.csv.gz"
    path.write_bytes(
        gzip.compress(("\n".join(",".join(f'"{x}"' for x in r) for r in [head, *rows]) + "\n").encode())
    )
    kernels = hp.main(["--durations", str(path)])["durations"]
    assert [k["id"] for k in kernels] == [0, 1, 2]
    assert [k["kernel"] for k in kernels] == [
        "loop_broadcast_fusion",
        "scoped_mosaic_gpu_kernel",
        "convert_dq",
    ]
    assert [round(k["us"], 2) for k in kernels] == [81.25, 9570.0, 103.04]
    assert kernels[1]["grid"] == "(1, 128, 32)"
    table = hp.durations_table(kernels)
    assert table.splitlines()[-1].split() == ["total", "9754.3", "us"]
    rows[0][5] = "cycle"
    path.write_bytes(
        gzip.compress(("\n".join(",".join(f'"{x}"' for x in r) for r in [head, *rows]) + "\n").encode())
    )
    with pytest.raises(ValueError, match="unit 'cycle'"):
        hp.durations(str(path))
    plain = tmp_path / "none.csv"
    plain.write_text(",".join(head) + "\n")
    with pytest.raises(ValueError, match="no Duration rows"):
        hp.durations(str(plain))


def test_hopper_profile_runs_the_steps_once_and_summarizes_ncu_csv(bench, tmp_path):
    """``hopper_profile.py``: a CPU dry run (interpret mode) of the calls it gives the profiler, and
    ``--summarize`` of an ncu details CSV, plain or gzipped (one column per kernel, rules by
    estimated speedup); bad shapes and empty CSVs are ValueErrors."""
    hp = bench("hopper_profile")
    out = hp.main(["--shape", "2:1:64", "--seq", "128", "--interpret"])
    o, (dq, dk, dv) = out["pallas_hopper"]
    assert o.shape == dq.shape == (1, 128, 2, 64) and dk.shape == dv.shape == (1, 128, 1, 64)
    assert all(np.isfinite(np.asarray(g)).all() for g in (o, dq, dk, dv)) and "cudnn" not in out
    assert "softcap" not in out
    capped = hp.main(
        ["--shape", "2:1:64", "--seq", "128", "--causal", "1", "--softcap", "0.5", "--interpret"]
    )
    o2, g2 = capped["softcap"]
    # the capped step is causal attention over 0.5 * tanh(logits / 0.5) (float64 here; the kv head
    # is shared by both query heads)
    q, k, v, _ = (np.asarray(x, np.float64) for x in hp.inputs(128, 2, 1, 64))
    s = 0.5 * np.tanh(np.einsum("qhd,kd->hqk", q[0], k[0, :, 0]) * 64**-0.5 / 0.5)
    s = np.where(np.tril(np.ones((128, 128), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("hqk,kd->qhd", p / p.sum(-1, keepdims=True), v[0, :, 0])
    assert np.abs(np.asarray(o2[0], np.float64) - want).max() < 2e-2 * np.abs(want).max()
    assert all(np.isfinite(np.asarray(g)).all() for g in g2)
    with pytest.raises(ValueError, match="--softcap -1.0: must be positive"):
        hp.main(["--shape", "2:1:64", "--seq", "128", "--softcap", "-1", "--interpret"])
    head = [
        "ID",
        "Kernel Name",
        "Section Name",
        "Metric Name",
        "Metric Unit",
        "Metric Value",
        "Rule Name",
        "Rule Description",
        "Estimated Speedup",
    ]
    rows = [
        ["0", "fwd_kernel", "SOL", "Duration", "ms", "107.00", "", "", ""],
        ["0", "fwd_kernel", "Mem", "Local Memory Spilling Requests", "", "0", "", "", ""],
        ["1", "bwd_kernel", "SOL", "Duration", "ms", "338.84", "", "", ""],
        ["1", "bwd_kernel", "Warp", "", "", "", "CPIStall", "3.2  cycles  stalled", "28.2"],
        ["1", "bwd_kernel", "Mem", "", "", "", "MemoryCacheAccessPattern", "local loads", "69.6"],
        ["1", "bwd_kernel", "Compute", "", "", "", "HighPipeUtilization", "Shared 58.8%", ""],
    ]
    path = tmp_path / "prof.csv"
    path.write_text("\n".join(",".join(f'"{x}"' for x in r) for r in [head, *rows]) + "\n")
    text = hp.main(["--summarize", str(path)])["summary"]
    lines = text.splitlines()
    assert "0:fwd_kernel" in lines[0] and "1:bwd_kernel" in lines[0]
    assert "107.00 ms" in lines[1] and "338.84 ms" in lines[1]
    bwd = lines[lines.index("1:bwd_kernel") :]
    assert bwd[1].startswith("  HighPipeUtilization (-): Shared 58.8%")
    assert bwd[2].startswith("  MemoryCacheAccessPattern (69.6%)") and "(28.2%)" in bwd[3]
    assert "3.2 cycles stalled" in bwd[3]
    packed = tmp_path / "prof.csv.gz"  # profiles are often kept gzipped
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert hp.summarize(str(packed)) == text
    path.write_text(",".join(head) + "\n")
    with pytest.raises(ValueError, match="no kernel rows"):
        hp.summarize(str(path))
    with pytest.raises(ValueError, match="heads=3 must be a positive multiple of kv_heads=2"):
        hp.parse_shape("3:2:64")


def test_hopper_profile_backward_takes_hopper_checks_variant_entries(bench):
    """``--backward`` is a ``hopper_check.py --backwards`` entry: a name, then BlockSizes fields."""
    hp = bench("hopper_profile")
    default = hp.block_sizes(128, "default", causal=False)
    assert default == hp.ph.default_block_sizes(128, causal=False)
    assert hp.block_sizes(128, "default/bwd_stages=3") == dataclasses.replace(
        hp.ph.default_block_sizes(128), bwd_stages=3
    )
    mosaic = hp.block_sizes(64, "mosaic/bwd_block_k=128/registers=232")
    assert (mosaic.backward, mosaic.bwd_block_k, mosaic.registers) == ("mosaic", 128, 232)
    assert hp.block_sizes(64, "deterministic") == hp.ph.deterministic_block_sizes(None, 64)
    with pytest.raises(ValueError, match="'cudnn/bwd_stages=3': must start with"):
        hp.block_sizes(128, "cudnn/bwd_stages=3")


def test_hopper_profile_sass_shares_stall_samples_by_opcode_reason_and_line(bench, tmp_path):
    """``--sass`` of an ncu source-page CSV (gzipped, with ncu's "Kernel Name" line before the
    header): sample shares per opcode (predicates and modifiers stripped) and per stall reason, the
    instructions ranked by samples, then per execution count (a loop body's instructions share
    one); a CSV without the samples column is a ValueError."""
    hp = bench("hopper_profile")
    head = [
        "Address",
        "Source",
        hp.SAMPLES,
        "Warp Stall Sampling (Not-issued Samples)",
        "Instructions Executed",
        "stall_barrier",
        "stall_long_sb",
        "stall_long_sb (Not Issued)",
    ]
    rows = [
        ["0x10", "@!P1  BRA 0x40", "600", "500", "16", "0", "600", "500"],
        ["0x20", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "300", "200", "32", "300", "0", "0"],
        ["0x30", "@P0 BRA 0x10", "100", "50", "32", "100", "0", "0"],
        ["0x40", "EXIT", "0", "0", "1", "0", "0", "0"],
    ]
    path = tmp_path / "sass.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write('"Kernel Name","scoped_mosaic_gpu_kernel",\n')
        csv.writer(f).writerows([head, *rows])
    lines = hp.main(["--sass", str(path)])["sass"].splitlines()
    assert lines[0] == "4 instructions, 1000 stall samples"
    assert lines[1] == "by opcode: BRA 70.0%, WARPGROUP 30.0%, EXIT 0.0%"
    assert lines[2] == "by reason: long_sb 60.0%, barrier 40.0%"
    assert lines[4].split() == ["600", "60.0%", "16", "@!P1", "BRA", "0x40"]
    assert lines[5].split()[:3] == ["300", "30.0%", "32"]
    assert lines[8:] == [
        "by execution count (the instructions of one loop body ran equally often):",
        "  ran 16: 1 instructions, 60.0% of the samples (long_sb 100%)",
        "  ran 32: 2 instructions, 40.0% of the samples (barrier 100%)",
    ]
    plain = tmp_path / "details.csv"
    plain.write_text('"ID","Kernel Name"\n"0","k"\n')
    with pytest.raises(ValueError, match="no 'Warp Stall Sampling"):
        hp.sass_summary(str(plain))
    plain.write_text(",".join(head) + "\n" + ",".join(rows[0][:-1]) + "\n")
    with pytest.raises(ValueError, match="1 rows .* do not have the header's 8 columns"):
        hp.sass_summary(str(plain))


def test_hopper_profile_sass_prices_the_hottest_loop_per_opcode(bench, tmp_path):
    """With ncu's ``stall_selected`` column, ``--sass`` ends with the hottest loop body's warp
    cycles per instruction by opcode: an instruction's samples over the median selected samples of
    the body's instructions (MUFU keeps its function: EX2 and TANH apart). Made-up samples: a
    tanh its warp waits 7 issues at, an exp2 8, a multiply issued at once, a spin 20; a colder
    body (ran 8) is not priced."""
    hp = bench("hopper_profile")
    head = ["Source", hp.SAMPLES, "Instructions Executed", "stall_selected", "stall_wait"]
    rows = [
        ["MUFU.TANH R1, R1", "70", "64", "10", "60"],
        ["MUFU.EX2 R2, R2", "80", "64", "10", "70"],
        ["FMUL R3, R3, 0.5", "10", "64", "10", "0"],
        ["FMUL R4, R4, 0.5", "10", "64", "10", "0"],
        ["@!P1 BRA 0x40", "200", "64", "10", "190"],
        ["EXIT", "50", "8", "1", "49"],
    ]
    path = tmp_path / "sass.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([head, *rows])
    last = hp.main(["--sass", str(path)])["sass"].splitlines()[-1]
    assert last == (
        "hottest loop (ran 64, 5 instructions), warp cycles: "
        "BRA 1 x 20.0, MUFU.EX2 1 x 8.0, MUFU.TANH 1 x 7.0, FMUL 2 x 1.0"
    )


def test_hopper_profile_pipes_per_kernel_from_the_raw_page(bench, tmp_path):
    """``--pipes`` of ncu's raw page (gzipped; a units row under the header, then a row per
    kernel): each kernel's busy share per pipe in ``PIPES``' order; a CSV without those metrics
    (another section set) is a ValueError naming them."""
    hp = bench("hopper_profile")
    head = ["ID", "Kernel Name", "gpu__time_duration.sum", *hp.PIPES.values()]
    units = ["", "", "ms", *["%"] * len(hp.PIPES)]
    rows = [
        ["0", "anonymous_mosaic_gpu_kernel", "12.9", "72.8", "37.6", "11.4", "17.1", "8.6", "2.4"],
        ["1", "anonymous_mosaic_gpu_kernel", "14.9", "60.8", "61.8", "13.1", "14.6", "7.1", "2.0"],
    ]
    path = tmp_path / "raw.csv.gz"
    with gzip.open(path, "wt", newline="") as f:
        csv.writer(f).writerows([head, units, *rows])
    lines = hp.main(["--pipes", str(path)])["pipes"].splitlines()
    assert lines[0].split() == ["kernel", "tensor", "xu", "(MUFU)", "fma", "alu", "uniform", "lsu"]
    assert lines[2].split() == [
        "1:anonymous_mosaic_gpu_kern",
        "60.8%",
        "61.8%",
        "13.1%",
        "14.6%",
        "7.1%",
        "2.0%",
    ]
    assert len(lines) == 3
    plain = tmp_path / "details.csv"
    plain.write_text('"ID","Kernel Name"\n"","" \n')
    with pytest.raises(ValueError, match="sm__pipe_tensor_cycles_active"):
        hp.pipes(str(plain))


def test_hopper_profile_ptxas_reads_registers_and_spills_per_kernel(bench, tmp_path):
    """``--ptxas`` of a run's output with ``MOSAIC_GPU_DUMP_PTXAS=1`` (gzipped; the ptxas lines as
    jaxlib 0.11.2 printed them on an H200, with its failed SASS dump after the first kernel; the
    SASS lines after the second are made up, in nvdisasm's format, since that machine has no
    nvdisasm): per kernel in compile order its name, registers, stack and spill bytes, and the
    LDL/STL count of any SASS after it; a log without ptxas lines is a ValueError."""
    hp = bench("hopper_profile")
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'anonymous_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for anonymous_mosaic_gpu_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 16 barriers, 1 bytes smem
nvdisasm invocation failed: INTERNAL: Process spawn failed: No such file or directory
ptxas warning : Registers are spilled to local memory in function 'scoped_mosaic_gpu_kernel'
ptxas info    : Compiling entry function 'scoped_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for scoped_mosaic_gpu_kernel
    200 bytes stack frame, 296 bytes spill stores, 336 bytes spill loads
ptxas info    : Used 168 registers, used 16 barriers, 200 bytes cumulative stack size
        /*0100*/                   STL.64 [R1+0x8], R4 ;
        /*0110*/                   LDL.64 R4, [R1+0x8] ;
        /*0120*/                   LDL R6, [R1] ;
        /*0130*/                   LDS R7, [R2] ;
"""
    path = tmp_path / "ptxas.log.gz"
    with gzip.open(path, "wt") as f:
        f.write(log)
    fwd, bwd = hp.main(["--ptxas", str(path)])["ptxas"]
    assert fwd == {
        "kernel": "anonymous_mosaic_gpu_kernel",
        "registers": 168,
        "stack_bytes": 0,
        "spill_store_bytes": 0,
        "spill_load_bytes": 0,
        "sass_LDL": 0,
        "sass_STL": 0,
    }
    assert bwd == {
        "kernel": "scoped_mosaic_gpu_kernel",
        "registers": 168,
        "stack_bytes": 200,
        "spill_store_bytes": 296,
        "spill_load_bytes": 336,
        "sass_LDL": 2,
        "sass_STL": 1,
    }
    plain = tmp_path / "plain.log"
    plain.write_text("profiled L=1024\n")
    with pytest.raises(ValueError, match='no "Compiling entry function" line'):
        hp.ptxas_summary(str(plain))


def test_hopper_check_min_ms_times_short_problems_longer(bench, monkeypatch):
    """``--min-ms``: a function whose warm-up call takes 4 ms is called 50 times for 200 ms
    (--reps 3), one of 150 ms the --reps 3 times; never more than MAX_REPS. Fake clock: every
    call of the function advances it by ``step`` seconds."""
    import jax.numpy as jnp

    hb = bench("hopper_bench")
    clock = {"t": 0.0}
    monkeypatch.setattr(hb.time, "perf_counter", lambda: clock["t"])
    monkeypatch.setattr(hb, "REPS", {"n": 3, "min_ms": 200.0})

    def count(step):
        calls = []

        def fn():
            calls.append(1)
            clock["t"] += step
            return jnp.zeros(())

        assert hb.time_fn(fn, (), compiled=True) == pytest.approx(step)
        return len(calls) - 1  # less the warm-up

    assert count(0.004) == 50
    assert count(0.150) == 3
    assert count(1e-5) == hb.MAX_REPS
    monkeypatch.setattr(hb, "REPS", {"n": 3, "min_ms": 0.0})
    assert count(0.004) == 3  # the default: --reps calls


# A made-up listing in nvdisasm's form: a two-trip loop (its latch a conditional forward exit and an
# unconditional backward branch) holding tensor-core work and a spill reload, an out-of-line
# mbarrier retry stub that jumps back into it, and a spin loop with no HGMMA.
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R2+URZ], R3 ;
        /*0020*/              @!P1 BRA `(.L_x_9) ;
.L_x_2:
        /*0030*/                   LDL.64 R20, [R1+0x8]                   (*"SpillRefill"*);
        /*0040*/                   WARPGROUP.ARRIVE ;
        /*0050*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0060*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;
        /*0070*/                   STL [R1+0x4], R9                       (*"SpillRefill"*);
        /*0080*/                   BAR.SYNC.DEFER_BLOCKING R224, 0x80 ;
        /*0090*/              @!P2 BRA `(.L_x_3) ;
        /*00a0*/                   BRA `(.L_x_1) ;
.L_x_3:
        /*00b0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P3, [R4+URZ], R5 ;
        /*00c0*/              @!P3 BRA `(.L_x_3) ;
        /*00d0*/                   EXIT ;
.L_x_9:
        /*00e0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R2+URZ], R3 ;
        /*00f0*/              @!P1 BRA `(.L_x_9) ;
        /*0100*/                   BRA `(.L_x_2) ;
"""


def test_sass_loops_counts_what_a_loop_pays_per_trip(bench):
    sass_loops = bench("sass_loops")
    (loop,) = sass_loops.loops(SASS)  # not the retry stub's jump back, not the spin loop
    assert (loop.start, loop.end) == (0x10, 0xA0)
    assert (loop.instructions, loop.hgmma, loop.ldl, loop.stl, loop.bar) == (10, 2, 1, 1, 2)
    mix = dict(sass_loops.opcode_mix(SASS, loop))
    assert mix["HGMMA"] == 2 and mix["BRA"] == 3 and mix["LDL"] == 1 and sum(mix.values()) == 10
    head, row = sass_loops.summary(SASS)
    assert head == "17 instructions, 2 HGMMA, 1 LDL, 1 STL in the whole kernel"
    assert row == "loop 0x0010-0x00a0: 10 instructions, 2 HGMMA, 1 LDL, 1 STL, 2 barrier ops"


def test_hopper_aot_reads_ptxas_output(bench):
    log = (
        "ptxas info    : Function properties for scoped_mosaic_gpu_kernel\n"
        "    200 bytes stack frame, 296 bytes spill stores, 336 bytes spill loads\n"
        "ptxas info    : Used 168 registers, used 16 barriers, 200 bytes cumulative stack size\n"
    )
    log += (
        "ptxas warning : (C7519) warpgroup.arrive is injected in around line 9 by "
        "compiler to allow use of registers in GMMA in function 'k'\n"
    )
    assert bench("hopper_aot").ptxas_info(log) == dict(
        registers=168, spill_stores=296, spill_loads=336, stack_frame=200, wgmma_notes=1, serialized=[]
    )
    assert bench("hopper_aot").ptxas_info("")["registers"] is None
    log += (
        "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are "
        "serialized due to insufficient register resources for the function 'k'\n"
    )
    assert bench("hopper_aot").ptxas_info(log)["serialized"] == ["C7512"]


def test_gpu_suite_summary_lists_every_case(bench, tmp_path):
    """``make test-gpu``'s summary: each case of the JUnit XML with its result, the counts and the
    run's wall time; a rerun's result of a case replaces the first run's, naming its run."""
    xml, rerun = tmp_path / "s.xml", tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest" time="3.25">'
        '<testcase classname="tests.test_gpu_suite" name="test_a[xla]" time="1.5"/>'
        '<testcase classname="tests.test_gpu_suite" name="test_b" time="2.0">'
        '<failure message="AssertionError: too far">trace</failure></testcase>'
        '<testcase classname="tests.test_gpu_suite" name="test_c" time="0">'
        '<skipped message="needs an H100"/></testcase></testsuite></testsuites>'
    )
    rerun.write_text(
        '<testsuites><testsuite name="pytest" time="2.5">'
        '<testcase classname="tests.test_gpu_suite" name="test_b" time="2.4"/>'
        "</testsuite></testsuites>"
    )
    gs = bench("gpu_suite_summary")
    rows = gs.cases(str(xml))
    assert [r[:2] for r in rows] == [
        ("test_gpu_suite::test_a[xla]", "pass"),
        ("test_gpu_suite::test_b", "FAIL"),
        ("test_gpu_suite::test_c", "skip"),
    ]
    one = gs.render(
        gs.merge([(rows, "abc1234")]),
        runs=[("abc1234", gs.wall_seconds(str(xml)), 3)],
        device="NVIDIA H100 80GB HBM3",
        jax_version="0.11.2",
        date="2026-12-06",
    )
    assert "**1 passed, 1 failed, 1 skipped** (run 1: commit `abc1234`, 3 cases in 3 s)" in one
    assert "| `test_gpu_suite::test_b` | FAIL | 2.0 | AssertionError: too far |" in one
    out = tmp_path / "s.md"
    gs.main(
        [
            str(xml),
            str(out),
            "--commit",
            "abc1234",
            "--rerun",
            f"{rerun}@def5678",
            "--device",
            "NVIDIA H100 80GB HBM3",
            "--jax",
            "0.11.2",
        ]
    )
    text = out.read_text()
    assert "**2 passed, 0 failed, 1 skipped**" in text and "run 2: commit `def5678`" in text
    assert "| `test_gpu_suite::test_b` | pass | 2.4 | 2 | run 1: FAIL (AssertionError: too far) |" in text
