# One-H200 lease k (issue 16, session 2026-12-01 #9): bash devrun/start.sh h200_k 0
source "$(dirname "$0")/common.sh"
# 1. the deterministic target (>= 0.95x) with the overlapped forward in it (no mask, head dim 128)
step timeout 200 python3 benchmarks/attention.py --impls pallas_hopper --bare --deterministic --seqs 65536 --causal 0,1 --shapes 32:8:128,32:8:64 --reps 5 --out $R/det
# 2. head dim 64 (forward 0.97-0.99x): the overlap with 240 registers, 4 stages of 64 keys, 2 of 256, and 3 backward stages
step timeout 280 python3 benchmarks/hopper_check.py --out $R/d64f --parts bench --reps 5 --hard-limit 270 --shapes 32:8:64 --seqs 16384,65536 --causal 0,1 \
  --backwards default,default/fwd_overlap=true/pingpong=false/registers=240,default/block_k=64/stages=4,default/block_k=256/stages=2,default/bwd_stages=3
grep -h "time L" $R/d64f.txt | grep -v cudnn | cut -c1-200
