"""What the dq adds of the Mosaic GPU backwards cost: ``hopper_check.py`` with them removed.

The fused backwards add every pair's dq tile to a float32 buffer in global memory: the head-dim-128
and -64 kernels by TMA reduce-adds (``hopper_fused_bwd``, ``hopper_cta_dq_bwd``), the head-dim-256
split kernel by per-element atomics (``hopper_split_bwd``). ``--drop split_add`` / ``fused_add``
replace those adds by nothing, then run ``benchmarks/hopper_check.py`` with the remaining arguments:
the gradients are wrong on purpose and only the timings mean something (the time the adds take is
the difference to a normal run). Results: ``benchmarks/results/pallas_hopper_h200.md``.

  PYTHONPATH=. python3 benchmarks/hopper_dq_cost.py --drop split_add --out $OUT/x --parts bench \\
      --shapes 32:8:256 --seqs 65536 --backwards fused
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from ringattention.kernels import hopper_fused_bwd as hfb
from ringattention.kernels import hopper_split_bwd as hss

DROPS = ("split_add", "fused_add")


def drop(name: str) -> None:
    """Replaces one kind of dq add by nothing (in this process)."""
    if name == "split_add":
        hss._add = lambda cfg, x, gmem: None
    elif name == "fused_add":
        hfb.FusedOps.reduce_add = lambda self, staging, x, gmem: None
    else:
        raise ValueError(f"--drop {name!r}: must be one of {DROPS}")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--drop", required=True, help=f"comma-separated subset of {DROPS}")
    args, rest = ap.parse_known_args(argv)
    for name in args.drop.split(","):
        drop(name)
    sys.argv = ["hopper_check.py", *rest]
    runpy.run_path(os.path.join(os.path.dirname(__file__), "hopper_check.py"), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
