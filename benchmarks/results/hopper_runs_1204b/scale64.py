"""Head dim 64's dq tiles: scaled before each reduce-add or once after the kernel (2026-12-04, for
the next lease).

Run 2026-12-04 (second session; ``../hopper_runs_1204c/runs.md``): "after" 0.5-1.5% faster in 9 of
10 cells, 0.3% slower in the tenth. The library took it for dq (dk's scale stays in the kernel), so
``library`` below now names the kernel after that change; the description is of the run.

At head dim 128 the bisect (``bisect.md``) found the softmax scale applied to every dq tile before
its TMA reduce-add cost 6% at 128K tokens without a mask (0.92x -> 0.98x cuDNN when undone); the
library now adds head dim 128's tiles unscaled and scales dq once after the kernel. Head dim 64's
``hopper_cta_dq_bwd.alternating_kernel`` still scales in the loop: it was not part of the bisect.
Variants, monkeypatched in:

* ``library``: ``_take_turns`` multiplies each [64, 64] float32 tile by the scale before adding it;
* ``after``: the library's kernel given a scale of 1.0 (its multiplies become exact ones by 1.0,
  which the compiler may fold; ``MOSAIC_GPU_DUMP_PTXAS=1`` shows what is left), dq and dk scaled
  after it (dk's multiply, once per key CTA, moves out too: one pass over dk).

Timed with ``../hopper_runs_1203c/kv_init.py``'s harness (bare backward step, rounds in rotated
order, gradients compared with the library's):

  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1204b/scale64.py --backwards default \\
      --problems 32:8:64@16384+65536+131072,32:32:64@65536+131072 --variants library,after \\
      --rounds 5 --out $OUT/scale64
"""

from __future__ import annotations

import dataclasses
import sys

sys.path.insert(0, "benchmarks/results/hopper_runs_1203c")
import kv_init  # noqa: E402

from ringattention.kernels import hopper_cta_dq_bwd as hcb  # noqa: E402

LIBRARY = hcb._run


def run_scaled_after(*args, cfg):
    """``hopper_cta_dq_bwd._run`` with the kernel's scale 1.0, dq and dk scaled afterwards."""
    dq, dk, dv = LIBRARY(*args, cfg=dataclasses.replace(cfg, scale=1.0))
    return dq * cfg.scale, dk * cfg.scale, dv


VARIANTS = {"library": LIBRARY, "after": run_scaled_after}


def use(name: str) -> None:
    hcb._run = VARIANTS[name]


kv_init.USE["variant"] = use
kv_init.VARIANTS = VARIANTS

if __name__ == "__main__":
    kv_init.main()
