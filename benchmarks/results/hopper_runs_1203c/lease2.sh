# The second part of the 2026-12-03 (third session) lease: the dk/dv kernel with lse2 and delta
# loaded before its wgmmas (kv_probs(columns_first=True), in the library tree), from the
# repository root on the device:
#   check: the step cases against the float32 step reference with the deterministic backward
#          (two-kernel) and the default, then bitwise repeats;
#   ab:    forward+backward against cuDNN, deterministic and default, same run.
source benchmarks/lease_common.sh

case "${1:?check or ab}" in
check)
  CASES=causal-overlap-gqa-d64-bf16,noncausal-gqa-d128-bf16,ragged-noncausal-gqa4-d64-bf16
  CASES=$CASES,causal-overlap-seg-gqa-d64-bf16,noncausal-seg-mha-d128-bf16,causal-overlap-mha-d128-bf16
  CASES=$CASES,causal-after-seg-gqa-d128-fp16,ragged-causal-striped-seg-d80-bf16
  CASES=$CASES,long-causal-overlap-seg-gqa-d128-bf16,window200-noncausal-mha-d128-bf16
  step timeout 200 python3 benchmarks/hopper_check.py --parts steps --cases $CASES \
    --backwards deterministic --hard-limit 190 --out "$R/check"
  step timeout 120 python3 benchmarks/hopper_check.py --parts repeat --causal 1,0 \
    --shapes 32:8:128@16384 --backwards deterministic --hard-limit 110 --out "$R/repeat"
  grep -h "FAIL\|ERROR\|SUMMARY\|SKIP\|repeat\[" "$R"/check.txt "$R"/repeat.txt
  pack ;;
ab)
  step timeout 570 python3 benchmarks/hopper_check.py --parts bench --causal 1,0 \
    --shapes "${2:-32:32:128@16384+65536,32:8:64@65536}" --backwards deterministic,default \
    --reps "${5:-3}" --rounds "${3:-2}" --hard-limit "${4:-550}" --out "$R/ab"
  times "$R/ab.txt"
  pack ;;
esac
