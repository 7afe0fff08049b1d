"""Charts of the attention benchmark results: TFLOP/s against sequence length, cuDNN alongside.

Reads every ``benchmarks/results/*.json`` written by ``benchmarks/attention.py`` (block-size and chunk
sweeps are skipped: their ``meta.args.sweep`` or ``meta.args.block`` is set) and writes PNGs to
``benchmarks/results/plots/``:

* ``tflops_h{H}_k{K}_d{D}.png`` per head shape: forward and forward+backward TFLOP/s, causal and not,
  one line per (result file, series); the cuDNN baseline measured in the same run is drawn dashed.
* ``ratio_vs_cudnn.png``: every ring row's fraction of the cuDNN throughput of its own run.

It also prints a Markdown table of the plotted numbers, each row naming its result file (the README's
benchmark table). FLOP convention (from ``attention.py``): forward 4*B*H*L^2*D, halved when causal;
forward+backward 3.5x the forward. Ring Attention (Liu, Zaharia & Abbeel 2023).

    python benchmarks/plot.py [--results benchmarks/results] [--out benchmarks/results/plots]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = (("fwd_tflops", "forward"), ("fwdbwd_tflops", "forward + backward"))


def load(results_dir: str) -> list[dict]:
    """Rows of every non-sweep result file, each with ``file`` (its basename) and ``meta`` added."""
    rows = []
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict) or "rows" not in data or "meta" not in data:
            continue
        args = data["meta"].get("args", {})
        if args.get("sweep") or args.get("block"):
            continue  # tuning sweeps: not the defaults a user gets
        for row in data["rows"]:
            if not {"name", "heads", "kv_heads", "head_dim", "causal"} <= set(row):
                continue  # not an attention benchmark row (e.g. the model's throughput)
            rows.append({**row, "file": os.path.basename(path), "meta": data["meta"]})
    return rows


def _shape(row: dict) -> tuple[int, int, int]:
    return row["heads"], row["kv_heads"], row["head_dim"]


def _series(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    # (file, name) -> rows sorted by sequence length; "bare[...]" rows (a ring step without the ring)
    # are left out of the charts, "ring[...]" is what ring_attention delivers.
    out = collections.defaultdict(list)
    for row in rows:
        if row["name"].startswith("bare["):
            continue
        out[(row["file"], row["name"])].append(row)
    return {k: sorted(v, key=lambda r: r["seq"]) for k, v in sorted(out.items())}


def _label(file: str, name: str) -> str:
    return f"{'cuDNN' if name == 'cudnn' else name}  ({file})"


def plot_shape(rows: list[dict], shape: tuple[int, int, int], out_dir: str) -> str:
    """One 2x2 figure (mode x causal) for one head shape; returns the PNG path."""
    h, k, d = shape
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    colors = {}
    for col, causal in enumerate((True, False)):
        for row_i, (key, mode) in enumerate(MODES):
            ax = axes[row_i, col]
            sel = [r for r in rows if r["causal"] == causal]
            for (file, name), pts in _series(sel).items():
                color = colors.setdefault((file, name), f"C{len(colors)}")
                style = "--" if name == "cudnn" else "-"
                xs, ys = [r["seq"] for r in pts], [r[key] for r in pts]
                ax.plot(xs, ys, style, marker="o", color=color, label=_label(file, name))
                for x, y in zip(xs, ys) if name != "cudnn" else ():
                    ax.annotate(
                        f"{y:.0f}",
                        (x, y),
                        textcoords="offset points",
                        xytext=(0, 5),
                        ha="center",
                        fontsize=7,
                        color=color,
                    )
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)
            ax.set_title(f"{mode}, {'causal' if causal else 'non-causal'}")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
            if row_i == 1:
                ax.set_xlabel("sequence length (tokens)")
    seqs = sorted({r["seq"] for r in rows})
    for ax in axes[1]:
        ax.set_xticks(seqs, [f"{s // 1024}K" for s in seqs])
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8)
    devices = sorted({r["meta"].get("device", "?") for r in rows})
    fig.suptitle(
        f"attention TFLOP/s on {', '.join(devices)}: heads={h}, kv_heads={k}, head_dim={d}, batch 1, bf16"
    )
    fig.tight_layout(rect=(0, 0.08, 1, 0.96))
    path = os.path.join(out_dir, f"tflops_h{h}_k{k}_d{d}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_ratios(rows: list[dict], out_dir: str) -> str:
    """Bars: each ring row's TFLOP/s over the cuDNN row of the same run, forward and fwd+bwd."""
    ring = [r for r in rows if r["name"].startswith("ring[") and "fwd_vs_cudnn" in r]
    ring.sort(key=lambda r: (r["name"], _shape(r), r["seq"], not r["causal"]))
    labels = [
        f"{r['name']} {r['heads']}:{r['kv_heads']}:{r['head_dim']} {r['seq'] // 1024}K"
        f"{' causal' if r['causal'] else ''}"
        for r in ring
    ]
    fig, ax = plt.subplots(figsize=(12, 0.32 * len(ring) + 1.5))
    ys = range(len(ring))
    ax.barh([y - 0.2 for y in ys], [r["fwd_vs_cudnn"] for r in ring], 0.4, label="forward")
    ax.barh([y + 0.2 for y in ys], [r["fwdbwd_vs_cudnn"] for r in ring], 0.4, label="forward + backward")
    ax.set_yticks(list(ys), labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="grey", ls="--")
    ax.set_xlabel("fraction of cuDNN throughput measured in the same run (heads:kv_heads:head_dim)")
    ax.set_title("ring_attention (one device) relative to cuDNN flash attention")
    ax.legend(loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out_dir, "ratio_vs_cudnn.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def table(rows: list[dict]) -> str:
    """Markdown table of the non-bare rows, each citing its result file."""
    head = (
        "| series | H:K:D | seq | causal | fwd TFLOP/s | fwd+bwd TFLOP/s | vs cuDNN fwd / fwd+bwd "
        "| source |\n|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    keep = [r for r in rows if not r["name"].startswith("bare[")]
    keep.sort(key=lambda r: (_shape(r), r["seq"], not r["causal"], r["file"], r["name"]))
    for r in keep:
        ratio = "" if r["name"] == "cudnn" else (f"{r['fwd_vs_cudnn']:.2f} / {r['fwdbwd_vs_cudnn']:.2f}")
        lines.append(
            f"| {r['name']} | {r['heads']}:{r['kv_heads']}:{r['head_dim']} | "
            f"{r['seq'] // 1024}K | {'yes' if r['causal'] else 'no'} | "
            f"{r['fwd_tflops']:.0f} | {r['fwdbwd_tflops']:.0f} | {ratio} | "
            f"`benchmarks/results/{r['file']}` |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "plots"))
    args = ap.parse_args(argv)
    rows = load(args.results)
    if not rows:
        raise SystemExit(f"no benchmark result files (*.json with meta and rows) in {args.results}")
    os.makedirs(args.out, exist_ok=True)
    by_shape = collections.defaultdict(list)
    for row in rows:
        by_shape[_shape(row)].append(row)
    for shape, shape_rows in sorted(by_shape.items()):
        print("wrote", os.path.relpath(plot_shape(shape_rows, shape, args.out)))
    print("wrote", os.path.relpath(plot_ratios(rows, args.out)))
    print()
    print(table(rows))


if __name__ == "__main__":
    main()
