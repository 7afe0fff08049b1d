# Compile-only look at the register spills (2026-12-02, fourth session; about 250 s of device time
# were left): each default kernel of pallas_hopper compiled and run once at 1,024 tokens with
# MOSAIC_GPU_DUMP_PTXAS=1 and MOSAIC_GPU_DUMP_SASS=1 (ptxas's registers and spill bytes, then the
# SASS), five processes side by side; summaries by `hopper_profile.py --ptxas`. From the
# repository root on the device: `bash benchmarks/results/hopper_runs_1202d/lease_ptxas.sh`.
source benchmarks/lease_common.sh
run() {  # name shape causal backward
  env XLA_PYTHON_CLIENT_PREALLOCATE=false MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_SASS=1 \
    timeout 150 python3 benchmarks/hopper_profile.py --shape $2 --seq 1024 --causal $3 \
    --backward $4 > $R/ptxas_$1.log 2>&1
  echo "$1 rc=$?"
}
run c128_causal1 32:32:128 1 default &
run c128_causal0 32:32:128 0 default &
run g64_causal1 32:8:64 1 default &
run c128_mosaic1 32:32:128 1 mosaic &
run g256_causal1 32:8:256 1 default &
wait
for f in $R/ptxas_*.log; do
  echo "== $f"; python3 benchmarks/hopper_profile.py --ptxas $f 2>&1 | tail -8
  grep -m3 -i "error\|Traceback" $f
  gzip -f $f
done
pack
