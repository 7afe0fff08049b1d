"""The tables made from device runs: ``tools/hopper_table.py`` (the ratio-to-cuDNN grid of
``hopper_check.py`` outputs) and ``tools/gpu_suite_summary.py`` (``make test-gpu``'s summary of the
JUnit XML), on CPU.

The scripts are imported from ``tools/`` by the ``bench`` fixture (conftest.py). Speed is measured
on the device, never here: these tests only keep the scripts from rotting.
"""

from __future__ import annotations

import json

import pytest


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
