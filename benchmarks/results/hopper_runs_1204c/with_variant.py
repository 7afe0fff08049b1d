"""``benchmarks/hopper_check.py`` with a variant of an A/B script in this folder patched in
(2026-12-04, second session; ``MODULE:VARIANT``, or a bare ``VARIANT`` of ``overlap_dq``, as
``pipeline.sh`` passes it):

  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1204c/with_variant.py smem_ds:dk_smem \\
      --out ... --parts ...
"""

import importlib
import sys

sys.path.insert(0, "benchmarks/results/hopper_runs_1204c")
module, _, variant = sys.argv[1].rpartition(":")
importlib.import_module(module or "overlap_dq").use(variant)
import hopper_check  # noqa: E402  (on sys.path through kv_init)

print(f"with_variant: {module or 'overlap_dq'} {variant!r} patched in", flush=True)
sys.argv = ["hopper_check.py", *sys.argv[2:]]
hopper_check.main()
