# Second command of the compile-only lease: spills of variants of the causal head-dim-128 backward
# (BlockSizes fields overridden by BS=field=value,... through variant.py).
source benchmarks/lease_common.sh
run() {  # name shape causal BS
  env XLA_PYTHON_CLIENT_PREALLOCATE=false MOSAIC_GPU_DUMP_PTXAS=1 BS=$4 timeout 100 \
    python3 benchmarks/results/hopper_runs_1202d/variant.py --shape $2 --seq 1024 --causal $3 \
    > $R/ptxas2_$1.log 2>&1
  echo "$1 rc=$?"
}
run stages3 32:32:128 1 bwd_stages=3 &
run wgtile 32:32:128 1 dq_tile=warpgroup &
run gqa_causal 32:8:128 1 "" &
run gqa_split 32:8:128 1 split_group=True &
run gqa_full 32:8:128 0 "" &
run reg232 32:32:128 1 registers=232 &
wait
for f in $R/ptxas2_*.log; do
  echo "== $f"; python3 benchmarks/hopper_profile.py --ptxas $f 2>&1 | grep scoped\\\|Error | tail -3
  grep -m2 "Error" $f
done
pack
