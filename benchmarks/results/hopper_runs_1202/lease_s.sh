# One-H200 lease s (2026-12-02): the README's benchmark table (ring_attention on one device, 32:32:128, 16K and 64K) with today's kernels
source "$(dirname "$0")/common.sh"
step timeout 160 python3 benchmarks/attention.py --impls pallas_hopper --seqs 16384,65536 --causal 1,0 --shapes 32:32:128 --reps 3 --out $R/readme_1202
