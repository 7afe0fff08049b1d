# One-H200 lease n (issue 16): the final head-dim-64 defaults through the library; the deterministic (mosaic) backward with them
source "$(dirname "$0")/common.sh"
step timeout 130 python3 benchmarks/hopper_check.py --out $R/final --parts steps,ring --ring-dims 64 --hard-limit 120 --backwards default \
  --cases causal-overlap-seg-gqa-d64,ragged-noncausal-gqa4-d64,window300,causal-overlap-gqa-d64-fp16,noncausal-mha-d64
step timeout 110 python3 benchmarks/hopper_check.py --out $R/detb --parts bench --reps 3 --hard-limit 100 --shapes 32:8:64 --seqs 65536 --causal 1,0 \
  --backwards default,mosaic,mosaic/bwd_stages=2/registers=232
grep -h "time L" $R/detb.txt | grep fwdbwd | sed 's/pallas_hopper backward=//' | cut -c1-130
