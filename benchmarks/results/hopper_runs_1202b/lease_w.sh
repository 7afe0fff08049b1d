# One-H200 lease w (issue 16, 2026-12-02, second session): deterministic=True at head dim 64 without
# a mask (0.92-0.93x at 64K): its two-kernel backward with 240 and 224 registers per compute thread.
source benchmarks/lease_common.sh
step timeout 170 python3 benchmarks/hopper_check.py --out $R/det64r --parts bench --reps 3 --rounds 3 \
  --hard-limit 165 --shapes 32:8:64,32:32:64 --seqs 65536 --causal 0 \
  --backwards deterministic,deterministic/registers=240,deterministic/registers=224
times $R/det64r.txt
pack
