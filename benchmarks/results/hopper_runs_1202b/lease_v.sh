# One-H200 lease v (issue 16, 2026-12-02, second session): the grid cell that lease u's time budget
# cut (128K 32:32:64 full), and the README's 256K model row with the current defaults.
source benchmarks/lease_common.sh
step timeout 130 python3 benchmarks/hopper_check.py --out $R/grid64b --parts bench --reps 3 --rounds 3 \
  --hard-limit 125 --shapes 32:32:64 --seqs 131072 --causal 0 --backwards default,deterministic
step timeout 280 python3 benchmarks/model.py --fit-seqs= --warmup 1 --seqs 262144 --remat save_attn --steps 2 \
  --out $R/model_256k_save_attn.json
times $R/grid64b.txt
pack
