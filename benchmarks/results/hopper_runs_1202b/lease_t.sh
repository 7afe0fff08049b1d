# One-H200 lease t (issue 16, 2026-12-02, second session): the target grid at head dim 128
# with hopper_check --rounds 3 (interleaved passes, so a clock that drifts during the run moves
# cuDNN and ours alike): 16K/64K/128K, causal and full, kv heads 8 and 32; the default backward and
# what deterministic=True runs.
source benchmarks/lease_common.sh
step timeout 560 python3 benchmarks/hopper_check.py --out $R/grid128 --parts bench --reps 3 --rounds 3 \
  --hard-limit 550 --shapes 32:8:128,32:32:128 --seqs 16384,65536,131072 --causal 1,0 \
  --backwards default,deterministic
times $R/grid128.txt
pack
