# One-H200 lease l (issue 16): head dim 64 forward with 256-key blocks (the working tree's default)
source "$(dirname "$0")/common.sh"
# 1. correctness first: every head-dim-64 step case and the ring at 64 through the new default, ptxas spills
step bash -c "MOSAIC_GPU_DUMP_PTXAS=1 timeout 200 python3 benchmarks/hopper_check.py --out $R/chk --parts steps,ring --ring-dims 64 --cases d64 --hard-limit 190 > $R/chk_ptxas.log 2>&1"
grep -E "^(PASS|FAIL|ERROR|SUMMARY)" $R/chk_ptxas.log | cut -c1-160
grep -E "spill|Compiling entry|Function properties for" $R/chk_ptxas.log | gzip > $R/chk_spills.txt.gz
# 2. A/B at 16K and 64K: new default (block_k=256, 2 stages) vs the old forward (128, 3), 3 stages of 256, 240 registers, 3 backward stages
step timeout 300 python3 benchmarks/hopper_check.py --out $R/ab64 --parts bench --reps 5 --hard-limit 290 --shapes 32:8:64,32:32:64 --seqs 16384,65536 --causal 0,1 \
  --backwards default,default/block_k=128/stages=3,default/block_k=256/stages=3,default/registers=240,default/bwd_stages=3
# 3. 128K
step timeout 200 python3 benchmarks/hopper_check.py --out $R/ab128k --parts bench --reps 3 --hard-limit 190 --shapes 32:8:64 --seqs 131072 --causal 0,1 \
  --backwards default,default/block_k=128/stages=3,default/bwd_stages=3
grep -h "time L" $R/ab64.txt $R/ab128k.txt | grep -v cudnn | cut -c1-200
