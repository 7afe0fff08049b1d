# One-H200 lease r (issue 16, 2026-12-02): deterministic=True at head dim 64 (working tree: 128-key dq blocks) through the library, 64K full and 128K
source "$(dirname "$0")/common.sh"
step timeout 140 python3 benchmarks/attention.py --impls pallas_hopper --bare --deterministic --seqs 65536,131072 --causal 0 --shapes 32:8:64 --reps 3 --out $R/det64full
step timeout 100 python3 benchmarks/attention.py --impls pallas_hopper --bare --deterministic --seqs 131072 --causal 1 --shapes 32:8:64 --reps 3 --out $R/det64c128k
