# Next one-H200 lease (issue 16, after the 2026-12-01 late-night runs). BEFORE starting, apply the
# archived forward overlap locally (the device gets the working tree):
#   git apply benchmarks/results/hopper_runs_1201e/experiments/fwd_overlap.patch
# then: bash devrun/start.sh h200_next 0 (and `git apply -R` the patch afterwards).
source "$(dirname "$0")/common.sh"
# 1. FA3 forward overlap v3 (P converted after P.V lands): does ptxas still report C7513? check + A/B
step timeout 100 python3 benchmarks/results/hopper_runs_1201e/experiments/fwd_overlap.py --out $R/fo3_check --parts steps --backwards default --hard-limit 90 \
  --cases noncausal-gqa-d128,causal-overlap-seg-gqa-d64,causal-before-gqa-d64,long-causal,window300
step env MOSAIC_GPU_DUMP_PTXAS=1 timeout 130 python3 benchmarks/hopper_check.py --out $R/fo3_ab --parts bench --reps 5 --hard-limit 120 --shapes 32:8:128 --seqs 16384,65536 --causal 0,1 --backwards default,default/fwd_overlap=true,default/fwd_overlap=true/pingpong=false > $R/fo3_ab_ptxas.log 2>&1
grep -h -E "spill stores|C7513" $R/fo3_ab_ptxas.log | grep -v "ptxas warn" | sort | uniq -c
grep -h "time L" $R/fo3_ab.txt | grep " fwd "
# 2. dump PTX/SASS of the overlap kernels (16K full, one case) to find what defines a wgmma input
mkdir -p $R/dump_fo
step env MOSAIC_GPU_DUMP_TO=$R/dump_fo timeout 100 python3 benchmarks/hopper_check.py --out $R/fo3_dump --parts bench --reps 1 --hard-limit 90 --shapes 32:8:128 --seqs 16384 --causal 0 --backwards default/fwd_overlap=true > $R/fo3_dump.log 2>&1
ls -la $R/dump_fo | head -40
(cd $R && tar czf dump_fo.tgz.gz dump_fo && ls -la dump_fo.tgz.gz)
# 3. cuDNN's clock at 64K vs 128K (is the 128K gap ours alone?): ncu SpeedOfLight of every kernel
#    of one call each (ours: forward, backward; cuDNN: forward x2, backward, 2 reduces)
for L in 65536 131072; do
  step env -u XLA_PYTHON_CLIENT_MEM_FRACTION XLA_FLAGS="--xla_gpu_enable_command_buffer=" \
      XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 240 ncu --clock-control none --section SpeedOfLight -f --launch-count 8 --kernel-name regex:"mosaic|sdpa|cudnn|fmha|flash" \
      --export $R/cudnn_$L python3 benchmarks/hopper_profile.py --shape 32:8:128 --seq $L --causal 0
  ncu --import $R/cudnn_$L.ncu-rep --page details --csv > $R/cudnn_$L.csv 2>&1
  python3 benchmarks/hopper_profile.py --summarize $R/cudnn_$L.csv > $R/cudnn_${L}_summary.txt 2>&1; cat $R/cudnn_${L}_summary.txt
done
