# One-H200 lease: the forward with FA3's intra-warpgroup overlap (BlockSizes.fwd_overlap)
source "$(dirname "$0")/common.sh"
step timeout 200 python3 devrun/fwd_overlap.py --out $R/fo_check --parts steps --backwards default --hard-limit 190 \
  --cases causal-overlap-gqa-d64,causal-before-gqa-d64,noncausal-mha-d64,noncausal-gqa-d128,ragged-noncausal-gqa4,causal-overlap-seg-gqa-d64,noncausal-seg-mha-d128,causal-after-seg-gqa-d128-fp16,ragged-causal-overlap-seg,long-causal,causal-overlap-seg-gqa-d256,long-d256,window300,window200
step env MOSAIC_GPU_DUMP_PTXAS=1 timeout 200 python3 benchmarks/hopper_check.py --out $R/fo_ab1 --parts bench --reps 5 --hard-limit 190 --shapes 32:8:128,32:32:128 --seqs 16384,65536 --causal 0,1 --backwards default,default/fwd_overlap=true > $R/fo_ab1_ptxas.log 2>&1
grep -h -E "spill stores|serializ" $R/fo_ab1_ptxas.log | grep -v "ptxas info" | sort | uniq -c
grep -h "time L" $R/fo_ab1.txt | grep " fwd "
step env MOSAIC_GPU_DUMP_PTXAS=1 timeout 200 python3 benchmarks/hopper_check.py --out $R/fo_ab2 --parts bench --reps 5 --hard-limit 190 --shapes 32:8:64 --seqs 16384,65536 --causal 0,1 --backwards default,default/fwd_overlap=true > $R/fo_ab2_ptxas.log 2>&1
grep -h -E "spill stores|serializ" $R/fo_ab2_ptxas.log | grep -v "ptxas info" | sort | uniq -c
grep -h "time L" $R/fo_ab2.txt | grep " fwd "
step timeout 200 python3 benchmarks/hopper_check.py --out $R/fo_ab3 --parts bench --reps 3 --hard-limit 190 --shapes 32:8:128,16:8:256 --seqs 131072,65536 --causal 0 --backwards default,default/fwd_overlap=true
grep -h "time L" $R/fo_ab3.txt | grep " fwd "
