# Sourced by the one-GPU lease scripts (benchmarks/results/hopper_runs_*/lease_*.sh), run from the
# repository root on the device machine: `bash benchmarks/results/hopper_runs_1202b/lease_t.sh`.
#   R    results folder (default /tmp/res; it outlives one command on the same machine, so a later
#        command of the same lease can add to it);
#   OUT  set by the device tool: `pack` writes $R as one file, $OUT/res.tgz (the tool brings back
#        at most 8 files).
# `step CMD...` logs CMD with the time, its output and its exit code to stdout and $R/lease.log.
# (The lease scripts of hopper_runs_1201e ... hopper_runs_1202 sourced an uncommitted common.sh
# with the same step, R and memory fraction.)
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
R=${R:-/tmp/res}
mkdir -p "$R"

step() {
  echo "=== $(date +%T) $*" | tee -a "$R/lease.log"
  "$@" 2>&1 | tee -a "$R/lease.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $(date +%T) rc=$rc $1 $2" | tee -a "$R/lease.log"
}

pack() {
  tar czf "${OUT:?pack needs OUT}/res.tgz" -C "$R" . && ls -la "$OUT/res.tgz"
}

# The pipelines (hopper_runs_1204d/pipeline.sh, hopper_aot_1204/pipeline.sh) run under a
# deadline, $R/deadline (seconds since the epoch; rewritable while they run), and skip a part
# with less than MIN_PART seconds left (default 90):
# part SECONDS CMD...: CMD under timeout min(SECONDS, time left), or skipped
part() {
  local want=$1 left
  shift
  left=$(( $(cat "$R/deadline") - $(date +%s) ))
  if [ "$left" -lt "${MIN_PART:-90}" ]; then
    echo "=== skipped (${left}s left): $*" | tee -a "$R/lease.log"
    return 1
  fi
  [ "$want" -gt "$left" ] && want=$left
  step timeout -k 5 "$want" "$@"
}
left() { echo $(( $(cat "$R/deadline") - $(date +%s) - 20 )); }
# hl SECONDS: hopper_check's --hard-limit inside part SECONDS (its watchdog fires before timeout)
hl() { local l; l=$(left); [ "$1" -lt "$l" ] && l=$1; echo $(( l - 15 )); }

# The "time L=..." lines of hopper_check outputs (names shortened), for the reply's tail.
times() {
  grep -h "^time L" "$@" | sed 's/pallas_hopper backward=//' | cut -c1-150
}

# ptxas_variants SCRIPT PREFIX VARIANT...: each variant of a kv_init.py-style A/B script (its
# --variants) compiled once, fused backward at 32:32:128 and 1,024 tokens, causal and full, with
# MOSAIC_GPU_DUMP_PTXAS=1; prints ptxas's registers and spills per kernel (hopper_profile.py
# --ptxas) and keeps the log as $R/PREFIX<variant>.log.gz.
ptxas_variants() {
  local script=$1 prefix=$2 v
  shift 2
  for v in "$@"; do
    MOSAIC_GPU_DUMP_PTXAS=1 timeout 100 python3 "$script" --backwards default \
      --problems 32:32:128@1024 --variants "$v" --rounds 1 --reps 1 --out "$R/tmp" \
      > "$R/$prefix$v.log" 2>&1
    echo "== $v"; python3 benchmarks/hopper_profile.py --ptxas "$R/$prefix$v.log" | cut -c1-160
    gzip -f "$R/$prefix$v.log"
  done
}
