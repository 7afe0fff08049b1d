"""The committed benchmark results: every MFU they state divides by the datasheet peak, and
``benchmarks/plot.py`` redraws exactly the charts the docs cite from them. What the
test_benchmarks_*.py files share: bench_cases.py.
"""

from __future__ import annotations

import json
import os

import pytest
from bench_cases import BENCH, bench_fixture  # noqa: F401  (the bench fixture)

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
