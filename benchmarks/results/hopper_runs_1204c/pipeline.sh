# One H200 lease, 2026-12-04 (second session), started with setsid from the repository root:
#   R=/tmp/resA setsid bash benchmarks/results/hopper_runs_1204c/pipeline.sh > /tmp/resA.out 2>&1 &
# 1. overlap_dq.py: head dim 128's default backward with the dq wgmmas issued while dk, dv run,
#    against the library (bare backward step, rounds in rotated order);
# 2. if a variant wins (pick.py), the grid's head-dim-128 cells with it next to cuDNN and the full
#    device check with it patched in; otherwise the full check of the library and scale64
#    (hopper_runs_1204b: head dim 64's dq scaled after the kernel).
# Writes $R/DONE at the end.
source benchmarks/lease_common.sh
D=benchmarks/results/hopper_runs_1204c
step timeout 420 python3 $D/overlap_dq.py --backwards default \
  --problems 32:32:128@16384+131072,32:8:128@131072 --variants library,overlap,fa3 --rounds 3 \
  --out "$R/overlap_dq"
win=$(python3 $D/pick.py "$R/overlap_dq.json" 2> "$R/pick.txt")
cat "$R/pick.txt"; echo "winner: ${win:=library}" | tee -a "$R/pick.txt" "$R/lease.log"
if [ "$win" != library ]; then
  step timeout 590 python3 $D/with_variant.py "$win" --out "$R/grid128_$win" --parts bench \
    --reps 3 --rounds 3 --min-ms 300 --hard-limit 580 --shapes 32:8:128,32:32:128 \
    --seqs 16384,65536,131072 --causal 1,0 --backwards default
  times "$R/grid128_$win.txt"
  step timeout 560 python3 $D/with_variant.py "$win" --out "$R/check_$win" --parts steps,ring \
    --backwards default,deterministic,triton,fused --hard-limit 540
  grep -h "FAIL\|ERROR\|SUMMARY" "$R/check_$win.txt"
else
  step timeout 560 python3 benchmarks/hopper_check.py --out "$R/check" --parts steps,ring \
    --backwards default,deterministic,triton,fused --hard-limit 540
  grep -h "FAIL\|ERROR\|SUMMARY" "$R/check.txt"
  step timeout 500 python3 benchmarks/results/hopper_runs_1204b/scale64.py --backwards default \
    --problems 32:8:64@16384+65536+131072,32:32:64@65536+131072 --variants library,after \
    --rounds 5 --out "$R/scale64"
fi
touch "$R/DONE"
