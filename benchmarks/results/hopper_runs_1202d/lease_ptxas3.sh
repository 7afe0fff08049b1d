# Third command of the compile-only lease: the causal head-dim-128 backward's spills with its loop
# structure changed (loops_variant.py; compile-only, two_unmasked computes no mask).
source benchmarks/lease_common.sh
for L in one_masked two_unmasked; do
  env XLA_PYTHON_CLIENT_PREALLOCATE=false MOSAIC_GPU_DUMP_PTXAS=1 LOOPS=$L timeout 60 \
    python3 benchmarks/results/hopper_runs_1202d/loops_variant.py --shape 32:32:128 --seq 1024 \
    --causal 1 > $R/ptxas3_$L.log 2>&1 &
done
wait
for f in $R/ptxas3_*.log; do
  echo "== $f"; python3 benchmarks/hopper_profile.py --ptxas $f 2>&1 | grep scoped; grep -m2 Error $f
done
pack
