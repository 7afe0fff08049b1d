# Archived (2026-12-01, lease e): causal/segment-id backwards through one flat loop (every pair masked).
# Device: 15 PASS (cf_check.txt); A/B (cf_ab vs cf_base) lost at head dim 128 (16K 0.97x vs 1.01x,
# 64K 0.95x vs 0.97x), mixed at 64 (0.97x/1.00x vs 0.98x/0.98x). Not kept.
"""Experiment (next lease): causal (and segment-id) backwards with the flat loop too: one loop over
the group's (head, block) pairs, every pair through the masked body (an all-visible block's mask is
all true: the price is the compares and selects on blocks that need none), instead of a loop over
heads around an unmasked and a masked loop (the nest that carries dk/dv: causal spills 184/360
bytes against 112/108 without a mask). Windows keep the nest.

  python3 devrun/causal_flat.py ARGS        # patches, then runs benchmarks/hopper_check.py ARGS
  python3 devrun/causal_flat.py --selftest  # interpret mode vs reference + CUDA lowering (CPU)
"""
import runpy
import sys

from jax import lax

from ringattention.kernels import hopper_bwd_kernels as hbk

_orig_group_loop = hbk.group_loop


def group_loop(cfg, ops, body, bounds, masked, d, out_refs):
    if not masked or len(bounds) != 3 or cfg.groups == 1:
        return _orig_group_loop(cfg, ops, body, bounds, masked, d, out_refs)
    lo, n = bounds[0], bounds[2] - bounds[0]

    def pair(t, carry):
        return body(lo + lax.rem(t, n), carry, g=lax.div(t, n), masked=True)

    zeros = ops.full((cfg.rows, d), 0.0)
    dk, dv = lax.fori_loop(0, cfg.groups * n, pair, (zeros, zeros))
    dk_ref, dv_ref = out_refs
    dk_ref[...] = dk * cfg.scale
    dv_ref[...] = dv


hbk.group_loop = group_loop

if __name__ == "__main__":
    if sys.argv[1:] == ["--selftest"]:
        sys.path.insert(0, "devrun")
        import rows_layout

        rows_layout.hcd._split_columns = rows_layout._orig_split  # undo its patches
        rows_layout.hcd._scratch = rows_layout._orig_scratch
        rows_layout.hbk.load_keys = rows_layout._orig_load_keys
        rows_layout.selftest()
    else:
        sys.argv = ["hopper_check.py", *sys.argv[1:]]
        runpy.run_path("benchmarks/hopper_check.py", run_name="__main__")
