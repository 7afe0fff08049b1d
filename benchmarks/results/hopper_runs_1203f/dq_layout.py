"""Head dim 128's dq accumulator: the step's layout or head-major (2026-12-03, sixth session).

The fifth session made every pallas_hopper kernel write the step's [B, S, heads, D] layout. In the
default backward at head dim 128 (``hopper_cta_dq_bwd._split_columns``) that puts dq's TMA
reduce-adds, half tiles of [64 queries, 64 columns] float32, on rows 256 bytes long and H * D * 4
bytes apart. The target grid of this session (``grid128.txt``) ran 16K at 0.99-1.00x cuDNN but
64K without a mask at 0.97x and 128K without a mask at 0.91x (1,931 against 1,758 ms in the fourth
session's grid). The library now keeps the step's layout only up to
``STEP_LAYOUT_MAX_HEAD_DQ_BYTES`` of one head's dq (8 MiB: 16K tokens) and accumulates head-major
(plus one transpose) above it. Variants, set through that constant:

* ``library``: the rule;
* ``step``: the step's layout at every length (the fifth session's library);
* ``head``: head-major at every length (the fourth session's layout for dq).

``profile VARIANT ARGS...`` runs ``benchmarks/hopper_profile.py ARGS`` with that variant in place,
for Nsight Compute (``lease_next_h200.sh dqprof``: L2 and DRAM traffic of the backward kernel in
the step's layout and head-major).

Timed with ``hopper_runs_1203c/kv_init.py``'s harness (bare backward step, interleaved rounds,
gradients compared with the library's):

  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1203f/dq_layout.py --backwards default \\
      --problems 32:32:128@16384+32768+65536+131072 --variants library,step,head \\
      --out $OUT/dq_layout

Run in the seventh session (``../hopper_runs_1203g/``): the three variants timed within the
harness's 3% at every length, so the rule and its constant were removed from the library
(d98112a). To run this script again, check out a1fe79c's ``ringattention/``.
"""

from __future__ import annotations

import runpy
import sys

sys.path.insert(0, "benchmarks/results/hopper_runs_1203c")
import kv_init  # noqa: E402

from ringattention.kernels import hopper_cta_dq_bwd as hcb  # noqa: E402

LIBRARY = hcb.STEP_LAYOUT_MAX_HEAD_DQ_BYTES
VARIANTS = {"library": LIBRARY, "step": 2**62, "head": 0}


def use(name: str) -> None:
    hcb.STEP_LAYOUT_MAX_HEAD_DQ_BYTES = VARIANTS[name]


kv_init.USE["variant"] = use
kv_init.VARIANTS = VARIANTS

if __name__ == "__main__":
    if sys.argv[1:2] == ["profile"]:
        use(sys.argv[2])
        sys.argv = ["benchmarks/hopper_profile.py", *sys.argv[3:]]
        runpy.run_path("benchmarks/hopper_profile.py", run_name="__main__")
    else:
        kv_init.main()
