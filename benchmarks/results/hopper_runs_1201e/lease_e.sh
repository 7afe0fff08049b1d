# Next one-H200 lease (issue 16, after the 2026-12-01 night runs; start: bash devrun/start.sh h200_next 0)
source "$(dirname "$0")/common.sh"
# 1. the head-dim-256 backward with the flat loop against the reference (skipped by the budget last time)
step timeout 200 python3 benchmarks/hopper_check.py --out $R/d256_check --parts steps --cases d256,d192 --backwards default --hard-limit 190
# 1b. devrun/causal_flat.py (causal/ids GQA backwards through one flat loop, every pair masked;
#     interpret-checked and lowered on CPU): device check, ptxas, A/B vs main
step timeout 150 python3 devrun/causal_flat.py --out $R/cf_check --parts steps --cases causal-overlap-gqa-d64,causal-after,causal-before-gqa-d64,causal-overlap-seg-gqa-d64,ragged-causal-overlap,long-causal --backwards default --hard-limit 140
step env MOSAIC_GPU_DUMP_PTXAS=1 timeout 200 python3 devrun/causal_flat.py --out $R/cf_ab --parts bench --reps 5 --hard-limit 190 --shapes 32:8:128,32:8:64 --seqs 16384,65536 --causal 1 --backwards default > $R/cf_ab_ptxas.log 2>&1
step env MOSAIC_GPU_DUMP_PTXAS=1 timeout 200 python3 benchmarks/hopper_check.py --out $R/cf_base --parts bench --reps 5 --hard-limit 190 --shapes 32:8:128,32:8:64 --seqs 16384,65536 --causal 1 --backwards default > $R/cf_base_ptxas.log 2>&1
grep -h -E "spill stores|time L" $R/cf_ab_ptxas.log $R/cf_base_ptxas.log | grep -v "ptxas info"
# 2. causal: the producer spills at 24 registers (3.8% of samples on one reload); give it 40
step env MOSAIC_GPU_DUMP_PTXAS=1 timeout 200 python3 benchmarks/hopper_check.py --out $R/regs --parts bench --reps 5 --hard-limit 190 --shapes 32:8:128,32:32:128 --seqs 65536 --causal 1,0 --backwards default,default/registers=232 > $R/regs_ptxas.log 2>&1
grep -h -E "spill stores|time L" $R/regs_ptxas.log | grep -v "ptxas info"
# 3. the 128K GQA gap (0.93x full): tile variants at 128K
step timeout 200 python3 benchmarks/hopper_check.py --out $R/t128k --parts bench --reps 3 --hard-limit 190 --shapes 32:8:128 --seqs 131072 --causal 0 --backwards default,default/bwd_stages=3,default/registers=232
# 4. why GQA full attention drops at 128K (0.96x at 64K -> 0.93x): L2 hit rate / DRAM of the backward at 64K vs 128K
for L in 65536 131072; do
  step env -u XLA_PYTHON_CLIENT_MEM_FRACTION XLA_FLAGS="--xla_gpu_enable_command_buffer=" \
      XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 240 ncu --clock-control none --section MemoryWorkloadAnalysis --section SpeedOfLight -f --launch-count 1 \
      --kernel-name regex:"scoped_mosaic" --export $R/l2_$L python3 benchmarks/hopper_profile.py --shape 32:8:128 --seq $L --causal 0
  ncu --import $R/l2_$L.ncu-rep --page details --csv > $R/l2_$L.csv 2>&1
  python3 benchmarks/hopper_profile.py --summarize $R/l2_$L.csv > $R/l2_${L}_summary.txt 2>&1; cat $R/l2_${L}_summary.txt
done
