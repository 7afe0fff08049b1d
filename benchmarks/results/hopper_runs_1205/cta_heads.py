"""Several kv heads per key CTA in the fused backward (2026-12-03, fifth session).

At 16K tokens with a causal mask, 32:32:128 ran 3.4% slower than 32:8:128 for the same work
(15.23 against 14.73 ms forward+backward, ``hopper_runs_1204/grid128.txt``): 32:32 launches one
key CTA per (kv head, 128 keys), 4,096 CTAs of 2-256 block pairs, where 32:8's group loop runs the
4 query heads of a kv head in one CTA. A list-scheduling model of the launch order puts the
partial last wave at < 1%, so the difference would be a cost per CTA: pipeline fill and drain,
loading the own keys, writing dk/dv. ``cta_heads.patch`` adds
``BlockSizes.bwd_cta_heads`` (default 1): that many kv heads run one after another in one CTA (grid
K / heads); the producer streams their query blocks without a break, the compute warpgroups reload
their own keys between heads, dq's last reduce-add is waited for once. ``UNROLL_HEADS`` (in the
patch) chooses between the heads' code written out one after another and a ``fori_loop``.

Variants: ``library`` (1 kv head per CTA), ``h2``, ``h4`` (a ``fori_loop`` over the CTA's kv heads),
``u2``, ``u4`` (unrolled); timed with ``hopper_runs_1203c/kv_init.py``'s harness (bare backward
step, interleaved rounds, gradients compared with the library's). With the patch applied:

  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1205/cta_heads.py --backwards default \\
      --problems 32:32:128@16384+65536,32:32:64@16384 --variants library,h2,h4 --out $OUT/cta_heads

How it ran (``lease.sh``): ``heads`` (``cta_heads.json``: library, h2, h4), then ``unrolled``
(``unrolled.json``: library, u2, u4) and ``ptxas``. Every variant lost (1-11% slower; section
"2026-12-03 (fifth session)" of pallas_hopper_h200.md); the patch is not in the library and applies
to the commit that added this file.
"""

from __future__ import annotations

import sys

sys.path.insert(0, "benchmarks/results/hopper_runs_1203c")
import kv_init  # noqa: E402

from ringattention.kernels import hopper_fused_bwd as hfb  # noqa: E402

LIBRARY = hfb.cta_heads
# name: (kv heads per key CTA, their code unrolled rather than a fori_loop)
VARIANTS = {"library": (1, False), "h2": (2, False), "h4": (4, False), "u2": (2, True), "u4": (4, True)}


def use(name: str) -> None:
    m, unroll = VARIANTS[name]
    hfb.cta_heads = LIBRARY if m == 1 else (lambda _value, _kv_heads, m=m: m)
    hfb.UNROLL_HEADS = unroll


kv_init.USE["variant"] = use
kv_init.VARIANTS = VARIANTS

if __name__ == "__main__":
    kv_init.main()
