#!/bin/bash
# rotate_dq.py's, stage_ds.py's and ../hopper_runs_1204c/overlap_dq.py's variants of head dim 128's
# default backward compiled for an H200 without a GPU (benchmarks/hopper_aot.py, `make aot`'s
# virtualenv), with and without loop_descriptors; one JSON per compile, then table.py writes
# rotate.md, stage.md and order.md.
# From the repository root: bash benchmarks/results/hopper_aot_1205/run.sh
set -u
OUT=benchmarks/results/hopper_aot_1205
PY=${PY:-.venv-aot/bin/python}
RUNS_1204C=benchmarks/results/hopper_runs_1204c

# aot SHAPE CAUSAL FLAG MODULE:VARIANT VARIANT_DIR JSON: one compile, its report without the noise
aot() {
  PYTHONPATH=. $PY benchmarks/hopper_aot.py --shape "$1" --causal "$2" \
    --backward "default/loop_descriptors=$3" --variant "$4" --variant-dir "$5" --json "$6" 2>&1 \
    | grep -v "cudart_stub\|WARNING: All\|^[WI]0000\|nvdisasm invocation\|Source Location\|dump.cc\|^$"
}

for causal in 0 1; do
  for flag in false true; do
    for variant in library rotate rotate_overlap rotate_s rotate_0; do
      aot 32:32:128 $causal $flag rotate_dq:$variant $OUT $OUT/${variant}_c${causal}_${flag}.json
    done
    for variant in late early_wait late_early_wait dq_first dv_dq_dk; do
      aot 32:32:128 $causal $flag stage_ds:$variant $OUT \
        $OUT/stage_${variant}_c${causal}_${flag}.json
    done
    # overlap_dq.py's orders with dq's accumulator allocated next to dk's and dv's (overlap, fa3:
    # one C7519 note per loop) and in a scope where dq is issued (*_nested)
    for variant in overlap fa3 overlap_nested fa3_nested; do
      aot 32:32:128 $causal $flag overlap_dq:$variant $RUNS_1204C \
        $OUT/order_${variant}_c${causal}_${flag}.json
    done
  done
done
# GQA with a causal mask (the group loop around both loops), with the flag
for variant in library late_early_wait dq_first dv_dq_dk; do
  aot 32:8:128 1 true stage_ds:$variant $OUT $OUT/gqa_${variant}_c1_true.json
done
for variant in fa3 fa3_nested; do
  aot 32:8:128 1 true overlap_dq:$variant $RUNS_1204C $OUT/order_gqa_${variant}_c1_true.json
done
python3 $OUT/table.py rotate_dq.py $OUT/library_*.json $OUT/rotate*_c?_*.json > $OUT/rotate.md
python3 $OUT/table.py stage_ds.py $OUT/library_*.json $OUT/stage_*.json $OUT/gqa_*.json \
  > $OUT/stage.md
python3 $OUT/table.py overlap_dq.py $OUT/library_*.json $OUT/gqa_library_c1_true.json \
  $OUT/order_*.json > $OUT/order.md
