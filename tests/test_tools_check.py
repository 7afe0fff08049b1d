"""``tools/hopper_check.py`` and its parts (``hopper_run.py``: the ``--backwards`` entries as
BlockSizes, the state a run shares; ``hopper_bench.py``: timing next to cuDNN in rounds, the
bitwise repeats) parse their options and build what they promise, on CPU with fakes for the clock,
cuDNN and the kernels.

The scripts are imported from ``tools/`` by the ``bench`` fixture (conftest.py). Speed is measured
on the device, never here: these tests only keep the scripts from rotting.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest


def test_hopper_check_variants_become_block_sizes(bench):
    """``hopper_check.py --backwards`` entries: a backward name (or "default") plus BlockSizes fields."""
    hr = bench("hopper_run")
    from ringattention.kernels.hopper import pallas_hopper as ph

    assert hr.block_sizes("default", 128) == ph.default_block_sizes(128)
    got = hr.block_sizes("fused/bwd_block_k=128/registers=240", 64)
    want = dataclasses.replace(ph.default_block_sizes(64), backward="fused", bwd_block_k=128, registers=240)
    assert got == want and got.schedule == "pingpong3"  # the head-dim-64 defaults underneath
    assert hr.block_sizes("default/split_group=false", 128).split_group is False  # not the string
    full = hr.block_sizes("default", 64, causal=False)  # the registers follow the mask
    assert full == ph.default_block_sizes(64, causal=False) and full.registers == 232
    assert hr.block_sizes("default/registers=240", 64, causal=False) == hr.block_sizes("default", 64)
    for d, causal in ((64, True), (64, False), (128, True), (128, False), (256, True)):
        assert hr.block_sizes("deterministic", d, causal) == ph.deterministic_block_sizes(
            None, d, causal
        )  # what deterministic=True runs
    got = hr.block_sizes("deterministic/bwd_stages=3", 192, causal=False, v_head_dim=128)
    assert (got.backward, got.bwd_stages, got.schedule) == ("mosaic", 3, "overlap")  # MLA's forward
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
    monkeypatch.setattr(hr, "BACKWARDS", ["default", "default/registers=240"])
    assert [n for n, _ in hr.distinct_backwards(64, causal=False)] == hr.BACKWARDS  # 232 registers
    assert [n for n, _ in hr.distinct_backwards(64)] == ["default"]  # causal: 240, the same
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
