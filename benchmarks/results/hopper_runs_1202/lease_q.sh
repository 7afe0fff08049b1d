# One-H200 lease q (issue 16, 2026-12-02): deterministic=True's head-dim-64 tiles with 128-key dq blocks (working tree) checked, timed through the library, and bit-for-bit training
source "$(dirname "$0")/common.sh"
step timeout 150 python3 benchmarks/hopper_check.py --out $R/detchk2 --parts steps --hard-limit 140 \
  --cases ragged-noncausal-gqa4-d64,causal-overlap-seg-gqa-d64,causal-overlap-gqa-d64-fp16,ragged-causal-overlap-seg-gqa-d64,window300,long-causal \
  --backwards mosaic/bwd_stages=2/registers=232/bwd_block_k=128
step timeout 150 python3 benchmarks/attention.py --impls pallas_hopper --bare --deterministic --seqs 16384,65536 --causal 1,0 --shapes 32:8:64 --reps 5 --out $R/det64lib
step timeout 200 python3 benchmarks/determinism.py --out $R/determinism_h200
