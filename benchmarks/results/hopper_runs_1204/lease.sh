# The one-H200 lease of 2026-12-03 (fourth session), from the repository root on the device, one
# command per part:
#   kvcols: `bash benchmarks/lease_next_h200.sh kvcols` (kv_cols.py, in the tree before lag_dq);
#   ab:     lag_dq.py, the head-dim-128 fused backward with dq one pair late against the library's
#           lockstep kernel, then ptxas of both (ptxas_lag.log.gz, ptxas_lockstep.log.gz). It
#           lost, so check and bench (planned for a win) did not run;
#   check:  the step cases that run the one-dq-tile kernels against the float32 step reference;
#   bench:  forward+backward against cuDNN, same run;
#   grid:   the target grid with the library as committed, head dim ${2:-128}: 16K, 64K,
#           128K, causal and full, kv heads 8 and 32, default and deterministic backward
#           (`grid 128` with R=/tmp/res, then `grid 64` with R=/tmp/res2).
# (rerun16k, the 16K cells with 5 passes, was refused for lack of device time: it is
# `benchmarks/lease_next_h200.sh rerun16k` now.)
source benchmarks/lease_common.sh

case "${1:?ab, check, bench or grid}" in
ab)
  # As run, the tree had lag_dq.patch applied and this part timed `--variants library,lockstep`
  # with an earlier lag_dq.py that patched the library's kernel back in as "lockstep"; the
  # committed lag_dq.py times the same two kernels without the patch as "library" and "lag".
  step timeout 400 python3 benchmarks/results/hopper_runs_1204/lag_dq.py --backwards default \
    --variants library,lag --problems "${2:-32:32:128@16384+65536,32:8:128@65536}" \
    --out "$R/lag_dq"
  ptxas_variants benchmarks/results/hopper_runs_1204/lag_dq.py ptxas_ library lag
  pack ;;
check)
  CASES=noncausal-gqa-d128-bf16,noncausal-seg-mha-d128-bf16,causal-overlap-mha-d128-bf16
  CASES=$CASES,causal-after-seg-gqa-d128-fp16,ragged-noncausal-mha-d128-fp16
  CASES=$CASES,ragged-causal-striped-seg-d80-bf16,long-causal-overlap-seg-gqa-d128-bf16
  CASES=$CASES,window200-noncausal-mha-d128-bf16,causal-overlap-seg-gqa-d64-bf16
  step timeout 200 python3 benchmarks/hopper_check.py --parts steps --cases $CASES \
    --backwards default --hard-limit 190 --out "$R/check"
  grep -h "FAIL\|ERROR\|SUMMARY\|SKIP" "$R"/check.txt
  pack ;;
bench)
  step timeout 570 python3 benchmarks/hopper_check.py --parts bench --causal 1,0 \
    --shapes "${2:-32:32:128@16384+65536,32:8:128@65536}" --backwards default \
    --reps "${4:-3}" --rounds "${3:-3}" --hard-limit 550 --out "$R/bench"
  times "$R/bench.txt"
  pack ;;
grid)
  d=${2:-128}
  step timeout 590 python3 benchmarks/hopper_check.py --out "$R/grid$d" --parts bench --reps 3 \
    --rounds 3 --hard-limit 580 --shapes 32:8:$d,32:32:$d --seqs 16384,65536,131072 --causal 1,0 \
    --backwards default,deterministic
  times "$R/grid$d.txt"
  pack ;;
esac
