# One-H200 lease m (issue 16): head dim 64 backward tiles (240 registers, 3 stages), with the working tree's 256-key forward
source "$(dirname "$0")/common.sh"
step timeout 150 python3 benchmarks/hopper_check.py --out $R/chk2 --parts steps --hard-limit 140 --cases causal-overlap-seg-gqa-d64,ragged-causal-overlap-seg-gqa-d64,causal-after-gqa-d64,ragged-noncausal-gqa4-d64,window300,causal-before-gqa-d64 \
  --backwards default/registers=240/bwd_stages=3,default/bwd_stages=3,default/registers=240
step timeout 200 python3 benchmarks/hopper_check.py --out $R/bc --parts bench --reps 5 --hard-limit 190 --shapes 32:8:64,32:32:64 --seqs 16384,65536 --causal 1 \
  --backwards default,default/registers=240,default/registers=240/bwd_stages=3,default/bwd_stages=3
step timeout 120 python3 benchmarks/hopper_check.py --out $R/bf --parts bench --reps 5 --hard-limit 110 --shapes 32:32:64@16384,32:8:64@16384+65536 --causal 0 \
  --backwards default,default/bwd_stages=3
step timeout 150 python3 benchmarks/hopper_check.py --out $R/b128 --parts bench --reps 3 --hard-limit 140 --shapes 32:8:64 --seqs 131072 --causal 1,0 \
  --backwards default,default/bwd_stages=3,default/registers=240/bwd_stages=3
grep -h "time L" $R/bc.txt $R/bf.txt $R/b128.txt | grep fwdbwd | sed 's/pallas_hopper backward=//' | cut -c1-130
