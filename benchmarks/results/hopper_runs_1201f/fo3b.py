# Archived (2026-12-01, leases h-j): run as devrun/fo3b.py on the device (lease_i.sh).
"""Device check: defaults at head dims 64/128 patched to fwd_overlap=True, pingpong=False."""
import dataclasses
import runpy
import sys

from ringattention.kernels import pallas_hopper as ph

for d in (64, 128):
    ph._DEFAULTS[d] = dataclasses.replace(ph._DEFAULTS[d], fwd_overlap=True, pingpong=False)

if __name__ == "__main__":
    sys.argv = ["hopper_check.py", *sys.argv[1:]]
    runpy.run_path("benchmarks/hopper_check.py", run_name="__main__")
