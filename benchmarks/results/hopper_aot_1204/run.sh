#!/bin/bash
# The backward kernels at head dims 64, 128 and 256 compiled for an H200 without a GPU
# (benchmarks/hopper_aot.py, `make aot`'s virtualenv), with and without
# BlockSizes(loop_descriptors=True); one JSON per compile, then table.py writes aot.md.
# From the repository root: bash benchmarks/results/hopper_aot_1204/run.sh
set -u
OUT=benchmarks/results/hopper_aot_1204
PY=${PY:-.venv-aot/bin/python}
for backward in default deterministic; do
  for shape in 32:32:128 32:8:128 32:8:64; do
    for causal in 1 0; do
      for flag in false true; do
        name=$(echo "${backward}_${shape}_c${causal}_${flag}" | tr : -)
        PYTHONPATH=. $PY benchmarks/hopper_aot.py --shape $shape --causal $causal \
          --backward "$backward/loop_descriptors=$flag" --json $OUT/$name.json 2>&1 \
          | grep -v "cudart_stub\|WARNING: All\|^[WI]0000\|nvdisasm invocation\|Source Location\|dump.cc\|^$"
      done
    done
  done
done
# head dim 256: the default (the deterministic split pair) and the fused split kernel (atomics)
for backward in default fused; do
  for causal in 1 0; do
    for flag in false true; do
      name="${backward}_32-8-256_c${causal}_${flag}"
      PYTHONPATH=. $PY benchmarks/hopper_aot.py --shape 32:8:256 --causal $causal \
        --backward "$backward/loop_descriptors=$flag" --json $OUT/$name.json 2>&1 \
        | grep -v "cudart_stub\|WARNING: All\|^[WI]0000\|nvdisasm invocation\|Source Location\|dump.cc\|^$"
    done
  done
done
python3 $OUT/table.py $OUT/default_*.json $OUT/deterministic_*.json $OUT/fused_*.json > $OUT/aot.md
# ../hopper_runs_1204c/overlap_dq.py's orders (dq issued while dk, dv run), with and without the
# flag: spills, C7519
for variant in overlap fa3; do
  for causal in 1 0; do
    for flag in false true; do
      PYTHONPATH=. $PY benchmarks/hopper_aot.py --shape 32:32:128 --causal $causal \
        --backward "default/loop_descriptors=$flag" --variant overlap_dq:$variant \
        --variant-dir benchmarks/results/hopper_runs_1204c \
        --json $OUT/order_${variant}_c${causal}_${flag}.json 2>&1 \
        | grep -v "cudart_stub\|WARNING: All\|^[WI]0000\|nvdisasm invocation\|Source Location\|dump.cc\|^$"
    done
  done
done
