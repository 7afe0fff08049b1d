#!/bin/bash
# rotate_dq.py's and stage_ds.py's variants of head dim 128's default backward compiled for an
# H200 without a GPU (benchmarks/hopper_aot.py, `make aot`'s virtualenv), with and without
# loop_descriptors; one JSON per compile, then table.py writes rotate.md and stage.md.
# From the repository root: bash benchmarks/results/hopper_aot_1205/run.sh
set -u
OUT=benchmarks/results/hopper_aot_1205
PY=${PY:-.venv-aot/bin/python}
for variant in library rotate rotate_overlap rotate_s rotate_0; do
  for causal in 0 1; do
    for flag in false true; do
      PYTHONPATH=. $PY benchmarks/hopper_aot.py --shape 32:32:128 --causal $causal \
        --backward "default/loop_descriptors=$flag" --variant rotate_dq:$variant \
        --variant-dir $OUT --json $OUT/${variant}_c${causal}_${flag}.json 2>&1 \
        | grep -v "cudart_stub\|WARNING: All\|^[WI]0000\|nvdisasm invocation\|Source Location\|dump.cc\|^$"
    done
  done
done
for variant in late early_wait late_early_wait; do
  for causal in 0 1; do
    for flag in false true; do
      PYTHONPATH=. $PY benchmarks/hopper_aot.py --shape 32:32:128 --causal $causal \
        --backward "default/loop_descriptors=$flag" --variant stage_ds:$variant \
        --variant-dir $OUT --json $OUT/stage_${variant}_c${causal}_${flag}.json 2>&1 \
        | grep -v "cudart_stub\|WARNING: All\|^[WI]0000\|nvdisasm invocation\|Source Location\|dump.cc\|^$"
    done
  done
done
python3 $OUT/table.py rotate_dq.py $OUT/library_*.json $OUT/rotate*_c?_*.json > $OUT/rotate.md
python3 $OUT/table.py stage_ds.py $OUT/library_*.json $OUT/stage_*.json > $OUT/stage.md
