"""The benchmark scripts' CPU smoke modes (``--tiny``) run and write what they promise: the
attention-level scripts, ``attention.py``, ``window.py`` and the context-parallel ``cp_bytes.py``
(collective bytes of the compiled HLO against the formula) and ``cp_speed.py``.

Speed is measured on the device, never here: these tests only keep the scripts from rotting. What
the test_benchmarks_*.py files share: bench_cases.py.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from bench_cases import bench_fixture  # noqa: F401  (the bench fixture)


def test_attention_block_spec_keeps_pallas_hopper_defaults(bench):
    """``attention.py --block backward=mosaic``: string fields, over the head dim's defaults."""
    from ringattention.kernels.hopper import pallas_hopper as ph

    got = bench("attention").block_sizes_for("pallas_hopper", "backward=mosaic,bwd_stages=3", 128)
    assert got == dataclasses.replace(ph.default_block_sizes(128), backward="mosaic", bwd_stages=3)
    assert got.registers == 240


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
    size = bench("hlo_collectives").group_size
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
