# Archived experiment (benchmarks/results/pallas_hopper_h200.md, 2026-12-01 night): run as
# devrun/old_group.py from the repository root over commit 675d262 (it patches the library at run
# time, then runs benchmarks/hopper_check.py). Not part of the library; kept to reproduce.
"""A/B: only the GQA group loop as before the flat loop (a fori over heads around the new
block_loops); then runs benchmarks/hopper_check.py."""
import functools
import runpy
import sys

import jax.numpy as jnp
from jax import lax

from ringattention.kernels import hopper_bwd_kernels as hbk


def group_loop(cfg, ops, body, bounds, masked, d, out_refs):
    def head(g, carry):
        return hbk.block_loops(functools.partial(body, g=g), bounds, masked, carry)

    zeros = ops.full((cfg.rows, d), 0.0)
    if cfg.groups == 1:
        dk, dv = head(jnp.int32(0), (zeros, zeros))
    else:
        dk, dv = lax.fori_loop(0, cfg.groups, head, (zeros, zeros))
    dk_ref, dv_ref = out_refs
    dk_ref[...] = dk * cfg.scale
    dv_ref[...] = dv


hbk.group_loop = group_loop
sys.argv = ["hopper_check.py", *sys.argv[1:]]
runpy.run_path("benchmarks/hopper_check.py", run_name="__main__")
