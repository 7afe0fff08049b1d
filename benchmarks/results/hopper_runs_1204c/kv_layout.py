"""dk/dv's layout in the default backward, by length (2026-12-04, second session, for the next
lease). Run at 16K-64K in the third session (``../hopper_runs_1204d/runs.md``): the step's layout
1.6% faster in the bare backward at 16K, mixed from 32K, not visible in forward+backward next to
cuDNN; not adopted.

``hopper_fused_bwd.dkv_head_major(d)`` has the key-CTA kernels write dk, dv head-major
([B, K, Sk, D], then one float32 transpose each) at head dim 128 and in the step's layout
([B, Sk, K, D], no transpose) at head dim 64. Head dim 128's choice rests on one length: at 128K
tokens without a mask (``../hopper_runs_1204b/bisect.md``, dq already scaled after the kernel)
head-major ran 1,813.5 ms against 1,829.2 ms for the step's layout, 0.9% faster (within that
lease's spread). At 16K the two transposes took about 128 us each of a 10.1 ms backward at
32:32:128 causal, about 2.5%, and 32 us each at 32:8:128, about 0.65% (``../hopper_runs_1205``,
Nsight Compute, each kernel alone), so the step's layout may win at shorter lengths. Variants of
``dkv_head_major``, monkeypatched in (the kernels' output shapes, their dk/dv rows and the
transposes all follow it):

* ``library``: as shipped (head-major above head dim 64);
* ``step``: the step's layout at every head dim;
* ``head``: head-major at every head dim.

Timed with ``../hopper_runs_1203c/kv_init.py``'s harness (bare backward step, transposes
included, rounds in rotated order, gradients compared with the library's):

  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1204c/kv_layout.py --backwards default \\
      --problems 32:32:128@16384+32768+65536+131072,32:8:128@16384+65536 \\
      --variants library,step --rounds 3 --out $OUT/kv_layout128
"""

from __future__ import annotations

import sys

sys.path.insert(0, "benchmarks/results/hopper_runs_1203c")
import kv_init  # noqa: E402

from ringattention.kernels import hopper_fused_bwd as hfb  # noqa: E402

VARIANTS = {"library": hfb.dkv_head_major, "step": lambda d: False, "head": lambda d: True}


def use(name: str) -> None:
    hfb.dkv_head_major = VARIANTS[name]


kv_init.USE["variant"] = use

if __name__ == "__main__":
    kv_init.main()
