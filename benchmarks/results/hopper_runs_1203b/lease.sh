# The one-H200 lease of 2026-12-03 (second session): the fused backward with int32 fixed-point dq
# reduce-adds (BlockSizes(fixed_point_dq=True), which deterministic=True ran at head dims <= 128
# with fixed_point_dq.patch applied to the tree; the patch is not in the library), from the
# repository root on the device, one command per part (check and ab were run; ab64 was not):
#   check: every head-dim-64/80/128 step case against the float32 step reference (the new
#          deterministic backward with one dq tile per CTA, with the split group, and with one dq
#          tile per warpgroup), then bitwise repeats against the default fused backward;
#   ab:    same-run A/B of forward+backward, ratio to cuDNN: the new deterministic backward, the
#          two-kernel one it replaces ("mosaic"; at head dim 64 with its old tiles) and the default;
#   ab64:  the same at head dim 64 and GQA at 64K.
source benchmarks/lease_common.sh

case "${1:?check, ab or ab64}" in
check)
  CASES=causal-overlap-gqa-d64-bf16,noncausal-gqa-d128-bf16,ragged-noncausal-gqa4-d64-bf16
  CASES=$CASES,causal-overlap-seg-gqa-d64-bf16,noncausal-seg-mha-d128-bf16,causal-overlap-mha-d128-bf16
  CASES=$CASES,causal-after-seg-gqa-d128-fp16,ragged-causal-striped-seg-d80-bf16
  CASES=$CASES,long-causal-overlap-seg-gqa-d128-bf16,window200-noncausal-mha-d128-bf16
  step timeout 280 python3 benchmarks/hopper_check.py --parts steps --cases $CASES \
    --backwards deterministic,deterministic/split_group=true,deterministic/dq_tile=warpgroup \
    --hard-limit 270 --out "$R/check"
  step timeout 200 python3 benchmarks/hopper_check.py --parts repeat --causal 1,0 \
    --shapes 32:8:128@16384,32:32:64@16384 --backwards deterministic,default \
    --hard-limit 190 --out "$R/repeat"
  grep -h "FAIL\|ERROR\|SUMMARY\|SKIP\|repeat\[" "$R"/check.txt "$R"/repeat.txt
  pack ;;
ab)
  step timeout 570 python3 benchmarks/hopper_check.py --parts bench --causal 1,0 \
    --shapes 32:32:128@16384+65536 --backwards deterministic,mosaic,default \
    --reps 3 --rounds 3 --hard-limit 550 --out "$R/ab"
  times "$R/ab.txt"
  pack ;;
ab64)
  step timeout 570 python3 benchmarks/hopper_check.py --parts bench --causal 1,0 \
    --shapes 32:8:64@16384+65536,32:8:128@65536 \
    --backwards deterministic,mosaic/bwd_stages=2/registers=232/bwd_block_k=128,default \
    --reps 3 --rounds 3 --hard-limit 550 --out "$R/ab64"
  times "$R/ab64.txt"
  pack ;;
esac
