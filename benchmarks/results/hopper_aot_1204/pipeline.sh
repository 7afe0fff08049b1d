# The next one-H200 lease for issue 16 (planned 2026-12-04, fourth session, when no device was
# lent), started with setsid from the repository root:
#   R=/tmp/resA BUDGET=1500 setsid bash benchmarks/results/hopper_aot_1204/pipeline.sh \
#     > /tmp/resA.out 2>&1 &
# Each part gets at most its planned seconds and never runs past $R/deadline (start + BUDGET,
# rewritable while it runs); a part with less than MIN_PART seconds left is skipped. In order:
# 1. the device check of BlockSizes(loop_descriptors=True): every step case and the ring at head
#    dims 64, 128 and 256, default and deterministic backwards, against the float32 reference
#    (wgmma runs only on the device); any FAIL or ERROR stops the pipeline before timing;
# 2. the head-dim-128 target grid, the default backward with and without the flag interleaved in
#    each round, next to cuDNN;
# 3. ../hopper_aot_1205/stage_ds.py with the flag (added 2026-12-05): ds^T staged while dv, dk
#    run with the wait for dq's staging tile while dq runs (late_early_wait); dq issued before dv,
#    dk and added while they run (dq_first); FA3's order dv, dq, dk with ds^T staged while dv runs
#    (dv_dq_dk); ../hopper_runs_1204c/overlap_dq.py's two orders (dq issued while dv, dk run) with
#    dq's accumulator allocated where dq is issued (overlap_nested, fa3_nested: overlap and fa3,
#    which lost 2-9%, drew a C7519 note per loop; these draw none); against the library (bare
#    backward, rotated rounds, gradients compared with the library's; compiled for an H200 none
#    spills or draws a ptxas note: ../hopper_aot_1205/stage.md, order.md);
# 4. bwd_stages=3 against the library's 2, both with the flag (spilled 108-208 bytes without it);
# 5. the head-dim-256 grid with and without the flag (its dk/dv kernel spilled 56-116 bytes);
# 6. the 32K-128K rerun of the step's dk/dv layout (kv_layout.py, 5 rounds) that the third
#    session's second machine start lost.
# PY (default python3) runs each command; `PY=benchmarks/results/hopper_aot_1204/dry_py.sh`
# dry-runs the control flow on a CPU machine. Writes $R/DONE at the end.
source benchmarks/lease_common.sh
PY=${PY:-python3}
MIN_PART=90
FLAG=loop_descriptors=true
echo $(( $(date +%s) + ${BUDGET:-1500} )) > "$R/deadline"

# grid NAME D SECONDS BACKWARDS: the target grid at head dim D next to cuDNN
grid() {
  part "$3" $PY benchmarks/hopper_check.py --out "$R/$1" --parts bench --reps 3 --rounds 3 \
    --min-ms 300 --hard-limit "$(hl "$3")" --shapes "32:8:$2,32:32:$2" \
    --seqs 16384,65536,131072 --causal 1,0 --backwards "$4"
  times "$R/$1.txt"
}

part 420 $PY benchmarks/hopper_check.py --out "$R/ldesc_check" --parts steps,ring \
  --backwards "default/$FLAG,deterministic/$FLAG" --ring-dims 128,64,256 --hard-limit "$(hl 420)"
grep -h "FAIL\|ERROR\|SUMMARY" "$R/ldesc_check.txt" | tee -a "$R/lease.log"
if ! grep -q "SUMMARY" "$R/ldesc_check.txt" || grep -q "^FAIL\|^ERROR" "$R/ldesc_check.txt"; then
  echo "=== the check failed or did not finish: nothing timed" | tee -a "$R/lease.log"
  touch "$R/DONE"
  exit 1
fi

grid ldesc_grid128 128 560 "default,default/$FLAG"
part 450 $PY benchmarks/results/hopper_aot_1205/stage_ds.py --backwards "default/$FLAG" \
  --variants library,late_early_wait,dq_first,dv_dq_dk,overlap_nested,fa3_nested \
  --problems 32:32:128@16384+65536,32:8:128@65536 --rounds 3 --out "$R/stage_ab"
part 200 $PY benchmarks/results/hopper_runs_1204c/overlap_dq.py \
  --backwards "default/$FLAG,default/$FLAG/bwd_stages=3" --variants library \
  --problems 32:32:128@16384+65536,32:8:128@65536 --rounds 3 --out "$R/ldesc_ab"
grid ldesc_grid256 256 420 "default,default/$FLAG"
part 240 $PY benchmarks/results/hopper_runs_1204c/kv_layout.py --backwards default \
  --problems 32:32:128@32768+65536+131072 --variants library,step --rounds 5 \
  --out "$R/kv_layout_long"
touch "$R/DONE"
