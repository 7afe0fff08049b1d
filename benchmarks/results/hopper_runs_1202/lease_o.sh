# One-H200 lease o (issue 16, 2026-12-02; planned as devrun/h200_next.sh after hopper_runs_1201g)
source "$(dirname "$0")/common.sh"
# 1. head dim 128 causal: does 3 backward stages (+ the cta kernel's 208 KB) win as at head dim 64? and the 16K 32:32:128 causal 0.90x again
step timeout 200 python3 benchmarks/hopper_check.py --out $R/d128c --parts bench --reps 5 --hard-limit 190 --shapes 32:8:128,32:32:128 --seqs 16384,65536 --causal 1 \
  --backwards default,default/bwd_stages=3
# 2. the deterministic target with the new head-dim-64 defaults (causal was cut last time)
step timeout 150 python3 benchmarks/attention.py --impls pallas_hopper --bare --deterministic --seqs 65536 --causal 1,0 --shapes 32:8:64 --reps 5 --out $R/det64
# 3. the 1B preset's model table with the new head-dim-64 defaults (README's 8K / 32K rows)
step timeout 240 python3 benchmarks/model.py --fit-seqs= --warmup 1 --seqs 8192,32768 --remat none --steps 3 --out $R/model_1b.json
grep -h "time L" $R/d128c.txt | grep fwdbwd | cut -c1-140
# 4. the deterministic (two-kernel) backward's own tiles: 128-key dq blocks, 3 stages (zero-code variants)
step timeout 150 python3 benchmarks/hopper_check.py --out $R/dett --parts bench --reps 3 --hard-limit 140 --shapes 32:8:64,32:8:128 --seqs 65536 --causal 0,1 \
  --backwards mosaic/bwd_stages=2/registers=232,mosaic/bwd_stages=2/registers=232/bwd_block_k=128,mosaic/bwd_stages=3/registers=232
