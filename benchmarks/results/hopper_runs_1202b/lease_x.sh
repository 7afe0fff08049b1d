# One-H200 lease x (issue 16, 2026-12-02, second session): why GQA without a mask drops at 128K
# (lease t/u: 32:8:64 0.94x against 32:32:64 1.02x, same run): Nsight Compute's speed-of-light and
# memory sections of the default backward at 131,072 tokens, head dim 64, kv heads 8 and 32, clocks
# left alone (as hopper_runs_1201e's l2_* profiles of 32:8:128).
source benchmarks/lease_common.sh
for KV in 8 32; do
  step env -u XLA_PYTHON_CLIENT_MEM_FRACTION XLA_FLAGS="--xla_gpu_enable_command_buffer=" \
      XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 110 ncu --clock-control none --section MemoryWorkloadAnalysis \
      --section SpeedOfLight -f --launch-count 1 --kernel-name regex:"scoped_mosaic" --export $R/l2_kv$KV \
      python3 benchmarks/hopper_profile.py --shape 32:$KV:64 --seq 131072 --causal 0
  ncu --import $R/l2_kv$KV.ncu-rep --page details --csv > $R/l2_kv$KV.csv 2>&1
  python3 benchmarks/hopper_profile.py --summarize $R/l2_kv$KV.csv > $R/l2_kv${KV}_summary.txt 2>&1
  rm -f $R/l2_kv$KV.ncu-rep
  cat $R/l2_kv${KV}_summary.txt | head -16
done
pack
