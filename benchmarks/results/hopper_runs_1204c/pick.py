"""The winner of an ``overlap_dq.py`` run (its JSON): the variant whose geometric-mean speedup over
``library`` (ratio of the medians over rounds, per case) is the largest, if above ``MIN_GAIN`` with no
case slower than ``MAX_LOSS`` and gradients within ``MAX_REL`` of the library's; else "library".

  python3 benchmarks/results/hopper_runs_1204c/pick.py overlap_dq.json
  python3 benchmarks/results/hopper_runs_1204c/pick.py smem_ds.json dkv_smem   # its geometric mean
"""

import json
import math
import statistics
import sys

MIN_GAIN = 1.01  # geometric mean over the cases
MAX_LOSS = 0.99  # worst case
MAX_REL = 2e-2  # dq/dk/dv relative error against the library's (bf16 inputs, float32 sums)


def geomean(records: list, name: str) -> float:
    """``name``'s geometric-mean speedup over ``library`` (ratio of the medians over rounds)."""
    ratios = [statistics.median(r["ms"]["library"]) / statistics.median(r["ms"][name])
              for r in records]
    return math.exp(sum(map(math.log, ratios)) / len(ratios))


def main(path: str) -> str:
    records = json.load(open(path))["records"]
    best, best_gain = "library", MIN_GAIN
    names = [n for n in records[0]["ms"] if n != "library"]
    for name in names:
        ratios = [statistics.median(r["ms"]["library"]) / statistics.median(r["ms"][name])
                  for r in records]
        errs = [e for r in records for e in r["rel_err_vs_library"].get(name, [])]
        gain = math.exp(sum(map(math.log, ratios)) / len(ratios))
        ok = min(ratios) >= MAX_LOSS and max(errs, default=0.0) <= MAX_REL
        print(f"{name}: geomean {gain:.4f}, per case " + " ".join(f"{x:.3f}" for x in ratios)
              + f", max rel err {max(errs, default=0.0):.1e}", file=sys.stderr)
        if ok and gain > best_gain:
            best, best_gain = name, gain
    return best


if __name__ == "__main__":
    if len(sys.argv) > 2:
        print(f"{geomean(json.load(open(sys.argv[1]))['records'], sys.argv[2]):.4f}")
    else:
        print(main(sys.argv[1]))
