"""``benchmarks/options.py``, the speed of each attention option against the plain ring: its CPU smoke
mode (``--tiny``) runs and writes what it promises, and its timing, rounds and FLOP counts.

Speed is measured on the device, never here: these tests only keep the script from rotting. What
the test_benchmarks_*.py files share: bench_cases.py.
"""

from __future__ import annotations

import json

import pytest
from bench_cases import bench_fixture  # noqa: F401  (the bench fixture)


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
