# Archived (2026-12-01, lease e-g): patches ringattention defaults to fwd_overlap=True for the
# device check; needs experiments/fwd_overlap.patch applied first.
"""Device check of the forward with FA3's intra-warpgroup overlap (BlockSizes.fwd_overlap): the
defaults patched to fwd_overlap=True, then benchmarks/hopper_check.py ARGS (its step cases run the
default block sizes)."""
import dataclasses
import runpy
import sys

from ringattention.kernels import pallas_hopper as ph

for d, bs in list(ph._DEFAULTS.items()):
    ph._DEFAULTS[d] = dataclasses.replace(bs, fwd_overlap=True)

if __name__ == "__main__":
    sys.argv = ["hopper_check.py", *sys.argv[1:]]
    runpy.run_path("benchmarks/hopper_check.py", run_name="__main__")
