"""The benchmark charts the docs show, drawn from the committed result files.

``python benchmarks/plot.py`` (no arguments) rewrites every chart in ``FIGURES`` under
``benchmarks/results/plots/``, and only those (each is cited by the README):

* ``pallas_hopper_vs_cudnn_h200.png`` from ``pallas_hopper_h200.json`` (``tools/hopper_check.py
  --parts bench`` records): the throughput of ``pallas_hopper`` (the ring step alone, default
  backward) over cuDNN's in the same process, per head shape and sequence length; forward and
  forward+backward, causal and full. Each point is the record's ``vs_cudnn`` (the median of the
  interleaved passes' own ratios); above 1.0 is faster than cuDNN. The same numbers as tables:
  ``pallas_hopper_h200.md`` (``tools/hopper_table.py``). Ring Attention (Liu, Zaharia & Abbeel 2023);
  FlashAttention-3 (Shah et al. 2024) for the Hopper kernels.

    python benchmarks/plot.py [--results benchmarks/results] [--out benchmarks/results/plots]
"""

from __future__ import annotations

import argparse
import collections
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = (("fwd", "forward"), ("fwdbwd", "forward + backward"))
MASKS = ((True, "causal"), (False, "full (non-causal)"))
SERIES = "pallas_hopper backward=default"  # what a user gets; the deterministic backward is in the .md
HEAD_DIM_COLORS = {64: "C0", 128: "C1", 256: "C2"}
DPI = 100  # with the 10 x 7 inch figure: 1000 x 700 pixels, well under 150 KB


Ratios = dict[tuple[str, bool], dict[tuple[int, int, int], list[tuple[int, float]]]]


def hopper_ratios(path: str) -> tuple[dict, Ratios]:
    """``(provenance, {(mode, causal): {(heads, kv_heads, head_dim): [(seq, ratio), ...]}})`` of the
    ``SERIES`` time records of every section of a ``hopper_check.py`` result file (sorted by seq)."""
    with open(path) as f:
        data = json.load(f)
    out: Ratios = collections.defaultdict(lambda: collections.defaultdict(list))
    for value in data.values():
        if not isinstance(value, dict) or "records" not in value:
            continue  # the provenance
        for r in value["records"]:
            if r.get("kind") == "time" and r["name"] == SERIES:
                shape = (r["heads"], r["kv_heads"], r["head_dim"])
                out[(r["mode"], r["causal"])][shape].append((r["seq"], r["vs_cudnn"]))
    if not out:
        raise ValueError(f"{path}: no {SERIES!r} time records (hopper_check.py --parts bench writes them)")
    ratios = {
        key: {shape: sorted(pts) for shape, pts in sorted(by_shape.items())} for key, by_shape in out.items()
    }
    return data.get("provenance", {}), ratios


def _shape_label(shape: tuple[int, int, int]) -> str:
    h, k, d = shape
    kind = "MHA" if h == k else f"GQA {h // k}:1"
    return f"head dim {d}, {h}:{k}:{d} ({kind})"


def _panel(ax, series: dict, seqs: list, title: str, row: int, col: int) -> None:
    """One panel: each shape's ratios against sequence length, with the cuDNN = 1.0x line."""
    ax.axhline(1.0, color="black", lw=1.2)
    ax.annotate(
        "cuDNN = 1.0x",
        (0.01, 1.0),
        xycoords=("axes fraction", "data"),
        xytext=(0, 2),
        textcoords="offset points",
        fontsize=8,
        va="bottom",
    )
    for shape, pts in series.items():
        mha = shape[0] == shape[1]
        ax.plot(
            [s for s, _ in pts],
            [v for _, v in pts],
            "-" if mha else "--",
            marker="o" if mha else "s",
            ms=5,
            color=HEAD_DIM_COLORS.get(shape[2], "C3"),
            label=_shape_label(shape),
        )
    ax.set_title(title, fontsize=11)
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqs, [f"{s // 1024}K" for s in seqs])
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    if row == 1:
        ax.set_xlabel("sequence length (tokens)")
    if col == 0:
        ax.set_ylabel("throughput / cuDNN's (x)")


def _legend(fig, axes, ratios: Ratios) -> None:
    """One legend entry per series (from whichever panel draws it), a column per head dim, MHA
    first."""
    by_label = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            by_label.setdefault(label, handle)
    shapes = sorted(
        {shape for by_shape in ratios.values() for shape in by_shape},
        key=lambda sh: (sh[2], sh[0] != sh[1], sh),
    )
    labels = [_shape_label(sh) for sh in shapes]
    fig.legend(
        [by_label[label] for label in labels],
        labels,
        loc="lower center",
        ncol=len({sh[2] for sh in shapes}),
        fontsize=9,
        frameon=False,
    )


def plot_hopper_vs_cudnn(source: str, png: str) -> Ratios:
    """The 2 x 2 chart (mode x mask) of ``hopper_ratios(source)``, written to ``png``; returns the
    plotted ratios."""
    provenance, ratios = hopper_ratios(source)
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True, sharey=True)
    seqs = sorted({s for by_shape in ratios.values() for pts in by_shape.values() for s, _ in pts})
    values = [v for by_shape in ratios.values() for pts in by_shape.values() for _, v in pts]
    for (row, (mode, mode_name)), (col, (causal, mask_name)) in (
        (m, c) for m in enumerate(MODES) for c in enumerate(MASKS)
    ):
        series = ratios.get((mode, causal), {})
        _panel(axes[row, col], series, seqs, f"{mode_name}, {mask_name}", row, col)
    pad = 0.03
    axes[0, 0].set_ylim(min(min(values), 1.0) - pad, max(max(values), 1.0) + pad)
    _legend(fig, axes, ratios)
    fig.suptitle(
        f"pallas_hopper vs cuDNN on one {provenance.get('device', '?')}: bf16, batch 1, "
        "the ring step alone; above 1.0x = faster",
        fontsize=12,
    )
    fig.text(
        0.5,
        0.94,
        f"{os.path.basename(source)} (jax {provenance.get('jax', '?')}); "
        "ratio of throughputs measured in the same process",
        ha="center",
        fontsize=9,
        color="0.35",
    )
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(png, dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    return ratios


# (result file, chart) -> how it is drawn: every chart the docs cite, and no other
FIGURES = {("pallas_hopper_h200.json", "pallas_hopper_vs_cudnn_h200.png"): plot_hopper_vs_cudnn}


def main(argv: list[str] | None = None) -> list[str]:
    """Writes every chart of ``FIGURES``; returns their paths."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=os.path.join(HERE, "results"), help="the result files' folder")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "plots"), help="where the PNGs go")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    written = []
    for (source, png), draw in FIGURES.items():
        path = os.path.join(args.out, png)
        draw(os.path.join(args.results, source), path)
        print("wrote", os.path.relpath(path))
        written.append(path)
    return written


if __name__ == "__main__":
    main()
