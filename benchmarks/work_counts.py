"""Per-device causal work at N=8 for each layout (no device needed): block pairs computed per step.

python benchmarks/work_counts.py > benchmarks/results/work_counts_n8.md
"""

import argparse
import datetime
import importlib.metadata
import subprocess

from ringattention import layouts


def git_commit() -> str:
    """The checkout's short commit hash ("unknown" outside git); result files name it."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance() -> str:
    """The line every result file starts with: date, commit, device, jax version."""
    return (
        f"Date {datetime.date.today().isoformat()} · commit `{git_commit()}` · CPU (counted, "
        f"not timed) · jax {importlib.metadata.version('jax')}"
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ring", type=int, default=8)
    ap.add_argument("--shard", type=int, default=8192)
    ap.add_argument("--block", type=int, default=512)
    a = ap.parse_args()
    print(provenance() + "\n")
    print(f"# Causal work per device, N={a.ring}, shard={a.shard}, block={a.block}\n")
    print(
        "Unmasked (query block, key block) pairs each device computes in each ring step "
        "(`ringattention.layouts.causal_work`). A ring step lasts as long as its busiest device.\n"
    )
    for lay in layouts.LAYOUTS:
        w = layouts.causal_work(lay, a.ring, a.shard, a.block)
        busiest = int(w.max(0).sum())
        print(
            f"## {lay}\n\nper device total: {w.sum(1).tolist()}; total {int(w.sum())}; "
            f"sum over steps of the busiest device: {busiest} "
            f"(ideal {int(w.sum()) / a.ring:.0f})\n"
        )
        print("| device | " + " | ".join(f"step {t}" for t in range(a.ring)) + " |")
        print("|---" * (a.ring + 1) + "|")
        for r in range(a.ring):
            print(f"| {r} | " + " | ".join(str(x) for x in w[r]) + " |")
        print()


if __name__ == "__main__":
    main()
