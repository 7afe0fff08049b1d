# The one-H200 lease of 2026-12-02 (sixth session), as run (with ordered_dq.patch applied to the
# tree; BlockSizes(ordered_dq=...) is not in the library). It ran twice: first with the first
# design (a semaphore per dq tile, a turn per add: the "v1_" files), then with the second
# (progress counters, a read only when behind: "v2_", the design in ordered_dq.patch). From the
# repository root on the device; each command ends inside the 10-minute limit. Order of the runs:
#   1. `bash .../lease.sh check` (v1): the device check of the head-dim-64/128 step cases with
#      ordered_dq against the float32 step reference (as many as fit in 190 s); bitwise repeats
#      (5 runs each) of the deterministic, ordered and default backwards at 32:8:128 16K causal
#      and 32:32:64 16K full; the ordered kernel's ptxas spills at 32:32:128 causal;
#   2. `bash .../lease.sh ab` (v1): same-run A/B, forward+backward, 3 rounds, 32:32:128 at 16K
#      and 64K, causal and full: deterministic (two-kernel) / ordered / default (unordered);
#   3. `bash .../lease.sh ablation` (v1): ordered_ablation.py, the parts of the protocol switched
#      off one by one, 32:32:128 16K;
#   4. `bash .../lease.sh check`, then `ab` (v2, the steps budget raised to 240 s);
#   5. `bash .../lease.sh ab2` (v2): the A/B at head dim 64, 32:8:64 16K/64K and 32:32:64 64K.
# Files: v1_* and v2_* (the packed outputs renamed by run), v1_ablation.*, v2_ab2.*.
source benchmarks/lease_common.sh
AB="deterministic,default/ordered_dq=true,default"

case "${1:?check, ab, ablation or ab2}" in
check)
  env XLA_PYTHON_CLIENT_PREALLOCATE=false MOSAIC_GPU_DUMP_PTXAS=1 timeout 120 \
    python3 benchmarks/hopper_profile.py --shape 32:32:128 --seq 1024 --causal 1 \
    --backward default/ordered_dq=true > "$R/ptxas_ordered.log" 2>&1 &
  step timeout 250 python3 benchmarks/hopper_check.py --parts steps --cases d64,d128 \
    --backwards default/ordered_dq=true --hard-limit 240 --out "$R/check_ordered"  # v1: 200, 190
  step timeout 200 python3 benchmarks/hopper_check.py --parts repeat --causal 1 \
    --shapes 32:8:128@16384 --backwards "$AB" --hard-limit 190 --out "$R/repeat_c"
  step timeout 150 python3 benchmarks/hopper_check.py --parts repeat --causal 0 \
    --shapes 32:32:64@16384 --backwards "$AB" --hard-limit 140 --out "$R/repeat_f"
  wait
  python3 benchmarks/hopper_profile.py --ptxas "$R/ptxas_ordered.log" 2>&1 | tail -4
  gzip -f "$R/ptxas_ordered.log"
  grep -h "FAIL\|ERROR\|SUMMARY\|repeat\[" "$R"/check_ordered.txt "$R"/repeat_*.txt
  pack ;;
ab)
  step timeout 560 python3 benchmarks/hopper_check.py --parts bench --causal 1,0 \
    --shapes 32:32:128@16384+65536 --backwards "$AB" \
    --reps 3 --rounds 3 --hard-limit 540 --out "$R/ab"
  times "$R/ab.txt"
  pack ;;
ablation)
  timeout 560 python3 benchmarks/results/hopper_runs_1202f/ordered_ablation.py --shape 32:32:128 \
    --seq 16384 --causal 1,0 --out "$OUT/ablation" ;;
ab2)
  step timeout 500 python3 benchmarks/hopper_check.py --parts bench --causal 1,0 \
    --shapes 32:8:64@16384+65536,32:32:64@65536 --backwards "$AB" --reps 3 --rounds 3 \
    --hard-limit 480 --out "$OUT/ab2" > /dev/null 2>&1
  times "$OUT/ab2.txt" ;;
esac
