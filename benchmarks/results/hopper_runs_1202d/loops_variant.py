"""Compile-only probe (results wrong on purpose for two_unmasked): which part of the causal
backward's loop structure adds the spills. LOOPS=one_masked: one masked loop over [lo, hi);
LOOPS=two_unmasked: the two loops of the causal kernel, neither masking."""

import functools
import os
import sys

sys.path.insert(0, "benchmarks")
import hopper_profile as hp
from jax import lax

from ringattention.kernels import hopper_bwd_kernels as hbk


def block_loops(body, bounds, masked, carry):
    lo, mid, hi = bounds[:3]
    if os.environ["LOOPS"] == "one_masked":
        return lax.fori_loop(lo, hi, functools.partial(body, masked=masked), carry)
    carry = lax.fori_loop(lo, mid, functools.partial(body, masked=False), carry)
    return lax.fori_loop(mid, hi, functools.partial(body, masked=False), carry)


hbk.block_loops = block_loops
hp.main(sys.argv[1:])
