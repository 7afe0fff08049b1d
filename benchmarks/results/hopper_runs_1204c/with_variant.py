"""``benchmarks/hopper_check.py`` with a variant of an A/B script in this folder patched in
(2026-12-04, second session; ``MODULE:VARIANT``, or a bare ``VARIANT`` of ``overlap_dq``, as
``pipeline.sh`` passes it; several joined by ``+``, patched in that order, as
``../hopper_runs_1204d/pipeline.sh`` passes them):

  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1204c/with_variant.py smem_ds:dk_smem \\
      --out ... --parts ...
  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1204c/with_variant.py \\
      smem_ds:dk_smem+kv_layout:step --out ... --parts ...
"""

import importlib
import sys

sys.path.insert(0, "benchmarks/results/hopper_runs_1204c")
for spec in sys.argv[1].split("+"):
    module, _, variant = spec.rpartition(":")
    importlib.import_module(module or "overlap_dq").use(variant)
    print(f"with_variant: {module or 'overlap_dq'} {variant!r} patched in", flush=True)
import hopper_check  # noqa: E402  (on sys.path through kv_init)

sys.argv = ["hopper_check.py", *sys.argv[2:]]
hopper_check.main()
