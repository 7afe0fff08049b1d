# One-H200 lease u (issue 16, 2026-12-02, second session): the target grid at head dim 64 (as
# lease_t), deterministic=True's head-dim-128 two-kernel backward with 3 and 4 stages (64-key dq
# blocks, 240 registers: they fit, 160 and 192 KB), and the README's 128K model row with the
# current defaults.
source benchmarks/lease_common.sh
step timeout 330 python3 benchmarks/hopper_check.py --out $R/grid64 --parts bench --reps 3 --rounds 3 \
  --hard-limit 320 --shapes 32:8:64,32:32:64 --seqs 16384,65536,131072 --causal 1,0 \
  --backwards default,deterministic
step timeout 150 python3 benchmarks/hopper_check.py --out $R/det128s --parts bench --reps 3 --rounds 3 \
  --hard-limit 140 --shapes 32:8:128,32:32:128 --seqs 65536 --causal 1,0 \
  --backwards deterministic,deterministic/bwd_stages=3,deterministic/bwd_stages=4
step timeout 110 python3 benchmarks/model.py --fit-seqs= --warmup 1 --seqs 131072 --remat save_attn --steps 2 \
  --out $R/model_128k_save_attn.json
times $R/grid64.txt $R/det128s.txt
pack
