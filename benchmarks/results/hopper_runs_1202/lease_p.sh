# One-H200 lease p (issue 16, 2026-12-02): the deterministic (two-kernel) backward's tiles at head dims 64 and 128; 16K 32:32:128 causal
source "$(dirname "$0")/common.sh"
# 1. correctness of the candidate deterministic tiles (every head-dim-64/128 step case that fits)
step timeout 170 python3 benchmarks/hopper_check.py --out $R/detchk --parts steps --hard-limit 160 --cases d64,d128 \
  --backwards mosaic/bwd_stages=2/registers=232/bwd_block_k=128,mosaic/bwd_block_k=128/bwd_stages=3
# 2. head dim 64 at 64K: today's deterministic tiles, + 128-key dq blocks, + 3 stages
step timeout 170 python3 benchmarks/hopper_check.py --out $R/det64t --parts bench --reps 3 --hard-limit 160 --shapes 32:8:64,32:32:64 --seqs 65536 --causal 0,1 \
  --backwards mosaic/bwd_stages=2/registers=232,mosaic/bwd_stages=2/registers=232/bwd_block_k=128,mosaic/bwd_stages=3/registers=232/bwd_block_k=128
grep -h "time L" $R/det64t.txt | grep fwdbwd | sed 's/pallas_hopper backward=//' | cut -c1-140
# 3. head dim 128 at 64K: today's deterministic tiles (240 registers), + 128-key dq blocks, + 3 stages
step timeout 200 python3 benchmarks/hopper_check.py --out $R/det128t --parts bench --reps 3 --hard-limit 190 --shapes 32:8:128,32:32:128 --seqs 65536 --causal 0,1 \
  --backwards mosaic,mosaic/bwd_block_k=128,mosaic/bwd_block_k=128/bwd_stages=3
grep -h "time L" $R/det128t.txt | grep fwdbwd | sed 's/pallas_hopper backward=//' | cut -c1-140
# 4. 16K 32:32:128 causal (0.91x twice): one dq tile per warpgroup, 232 registers
step timeout 80 python3 benchmarks/hopper_check.py --out $R/m16k --parts bench --reps 10 --hard-limit 70 --shapes 32:32:128 --seqs 16384 --causal 1 \
  --backwards default,default/dq_tile=warpgroup,default/registers=232
grep -h "time L" $R/m16k.txt | sed 's/pallas_hopper backward=//' | cut -c1-140
