# hopper_runs_1202c, second lease of 2026-12-02 (third session): BlockSizes(split_group=None), the
# new default, which splits the kv group where the measured rule says (hopper_fused_bwd.use_split_group),
# on the GQA cells of the issue-16 grid, then the 1B model at 128K and 256K (save_attn) to compare
# with hopper_runs_1202b's 10.81 s / 39.05 s. From the repository root:
# `bash benchmarks/results/hopper_runs_1202c/lease_d.sh`.
source benchmarks/lease_common.sh
step timeout 300 python3 benchmarks/hopper_check.py --out $R/gqa --parts bench --reps 3 --rounds 3 \
  --hard-limit 290 --shapes 32:8:64,32:8:128 --seqs 131072,65536,32768 --causal 0,1 --backwards default
step timeout 110 python3 benchmarks/model.py --fit-seqs= --warmup 1 --seqs 131072 --remat save_attn --steps 2 \
  --out $R/model_128k_save_attn.json
step timeout 80 python3 benchmarks/hopper_check.py --out $R/gqa16k --parts bench --reps 5 --rounds 3 \
  --hard-limit 75 --shapes 32:8:64,32:8:128 --seqs 16384 --causal 0,1 --backwards default
step timeout 200 python3 benchmarks/model.py --fit-seqs= --warmup 1 --seqs 262144 --remat save_attn --steps 2 \
  --out $R/model_256k_save_attn.json
times $R/gqa.txt $R/gqa16k.txt
python3 benchmarks/hopper_table.py $R/gqa.json $R/gqa16k.json
pack
