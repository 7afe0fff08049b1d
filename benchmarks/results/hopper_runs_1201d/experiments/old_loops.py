# Archived experiment (benchmarks/results/pallas_hopper_h200.md, 2026-12-01 night): run as
# devrun/old_loops.py from the repository root over commit 675d262 (it patches the library at run
# time, then runs benchmarks/hopper_check.py). Not part of the library; kept to reproduce.
"""A/B (lease C): the backward's loops as before the flat group loop (a fori over the group's heads
around block_loops' two loops, also without any mask). Then runs benchmarks/hopper_check.py."""
import functools
import runpy
import sys

import jax.numpy as jnp
from jax import lax

from ringattention.kernels import hopper_bwd_kernels as hbk


def block_loops(body, bounds, masked, carry):
    lo, mid, hi = bounds[:3]
    start = lo
    if len(bounds) == 4:
        carry = lax.fori_loop(lo, bounds[3], functools.partial(body, masked=True), carry)
        start = bounds[3]
    carry = lax.fori_loop(start, mid, functools.partial(body, masked=False), carry)
    return lax.fori_loop(mid, hi, functools.partial(body, masked=masked), carry)


def group_loop(cfg, ops, body, bounds, masked, d, out_refs):
    def head(g, carry):
        return block_loops(functools.partial(body, g=g), bounds, masked, carry)

    zeros = ops.full((cfg.rows, d), 0.0)
    if cfg.groups == 1:
        dk, dv = head(jnp.int32(0), (zeros, zeros))
    else:
        dk, dv = lax.fori_loop(0, cfg.groups, head, (zeros, zeros))
    dk_ref, dv_ref = out_refs
    dk_ref[...] = dk * cfg.scale
    dv_ref[...] = dv


hbk.block_loops = block_loops
hbk.group_loop = group_loop
sys.argv = ["hopper_check.py", *sys.argv[1:]]
runpy.run_path("benchmarks/hopper_check.py", run_name="__main__")
