# One-H200 lease: the forward overlap again, with the rescale after P.V (no C7513 serialization)
source "$(dirname "$0")/common.sh"
step timeout 100 python3 devrun/fwd_overlap.py --out $R/fo2_check --parts steps --backwards default --hard-limit 90 \
  --cases noncausal-gqa-d128,causal-overlap-seg-gqa-d64,causal-before-gqa-d64,long-causal,window300
step env MOSAIC_GPU_DUMP_PTXAS=1 timeout 130 python3 benchmarks/hopper_check.py --out $R/fo2_ab --parts bench --reps 5 --hard-limit 120 --shapes 32:8:128 --seqs 16384,65536 --causal 0,1 --backwards default,default/fwd_overlap=true > $R/fo2_ab_ptxas.log 2>&1
grep -h -E "spill stores|C7513" $R/fo2_ab_ptxas.log | grep -v "ptxas warn" | sort | uniq -c
grep -h "time L" $R/fo2_ab.txt | grep " fwd "
step env MOSAIC_GPU_DUMP_PTXAS=1 timeout 80 python3 benchmarks/hopper_check.py --out $R/fo2_ab64 --parts bench --reps 5 --hard-limit 70 --shapes 32:8:64 --seqs 65536 --causal 0,1 --backwards default,default/fwd_overlap=true > $R/fo2_ab64_ptxas.log 2>&1
grep -h "time L" $R/fo2_ab64.txt | grep " fwd "
