"""The target table from ``hopper_check.py`` outputs: one row per timed problem.

``hopper_check.py --parts bench`` writes one ``time`` record per function and mode with its ratio
to cuDNN in the same run (with ``--rounds N``, the median of each pass's own ratio). This prints
them as a markdown table, a row per (heads:kv_heads:head_dim, tokens, mask) and a column per
(variant, mode), so that a grid reads against the targets (forward and
forward+backward >= 1.0x of cuDNN; the deterministic backward >= 0.95x). A later file's record of
the same problem and column replaces an earlier one's (a re-run cell); a problem some variant of
which was not timed shows "-" there. ``--spread`` adds the lowest and highest of the passes' own
ratios to each cell, "0.95x (0.95-0.97)" (from the records' ``vs_cudnn_passes``, or in files
written before hopper_check recorded them, from the ``time_round`` records before each problem's
``time`` records).

  python3 tools/hopper_table.py grid128.json grid64.json > table.md
"""

from __future__ import annotations

import argparse
import json
import sys

PREFIX = "pallas_hopper backward="


def load(paths: list[str]) -> dict:
    """{(shape, seq, causal): {column: record}} of the ``time`` records of ``paths`` (later files
    win), cuDNN's own records left out (their ratio is 1 by definition)."""
    cells: dict = {}
    for path in paths:
        with open(path) as fh:
            records = json.load(fh)["records"]
        rounds, last = [], None  # the time_round records of the problem being read
        for r in records:
            if r.get("kind") == "time_round":
                rounds = [] if last == "time" else rounds
                rounds.append(r["ms"])
            last = r.get("kind")
            if last != "time" or r["name"] == "cudnn":
                continue
            shape = f"{r['heads']}:{r['kv_heads']}:{r['head_dim']}"
            name = r["name"].removeprefix(PREFIX)
            r = dict(r, vs_cudnn_passes=r.get("vs_cudnn_passes", _passes(rounds, r)))
            cells.setdefault((shape, r["seq"], r["causal"]), {})[f"{name} {r['mode']}"] = r
    return cells


def _passes(rounds: list[dict], r: dict) -> list[float]:
    """Each pass's own ratio to cuDNN of ``time`` record ``r``, from its problem's rounds."""
    this, cudnn = f"{r['name']} {r['mode']}", f"cudnn {r['mode']}"
    return [ms[cudnn] / ms[this] for ms in rounds if this in ms and cudnn in ms]


def _cell(r: dict, spread: bool) -> str:
    text = f"{r['vs_cudnn']:.2f}x"
    passes = r.get("vs_cudnn_passes") or []
    if spread and len(passes) > 1:
        text += f" ({min(passes):.2f}-{max(passes):.2f})"
    return text


def _sort_key(problem):
    shape, seq, causal = problem
    h, kvh, d = (int(x) for x in shape.split(":"))
    return (d, kvh, h, not causal, seq)


def table(cells: dict, spread: bool = False) -> str:
    """Markdown: a row per problem, a column per (variant, mode) in first-seen order; ratios to
    cuDNN (x; with ``spread`` the passes' lowest and highest), with the number of rounds behind
    each row's first ratio."""
    if not cells:
        raise ValueError("no 'time' records in the given files (run hopper_check.py --parts bench)")
    columns: list[str] = []
    for row in cells.values():
        columns += [c for c in row if c not in columns]
    lines = [
        "| shape | tokens | mask | " + " | ".join(columns) + " | rounds |",
        "|---|---:|---|" + "---:|" * len(columns) + "---:|",
    ]
    for problem in sorted(cells, key=_sort_key):
        shape, seq, causal = problem
        row = cells[problem]
        ratios = [_cell(row[c], spread) if c in row else "-" for c in columns]
        rounds = min(r.get("rounds", 1) for r in row.values())
        lines.append(
            f"| {shape} | {seq // 1024}K | {'causal' if causal else 'full'} | "
            + " | ".join(ratios)
            + f" | {rounds} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("paths", nargs="+", help="hopper_check.py .json outputs")
    ap.add_argument(
        "--spread", action="store_true", help="add the lowest and highest of the passes' ratios to each cell"
    )
    args = ap.parse_args(argv)
    text = table(load(args.paths), spread=args.spread)
    print(text)
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
