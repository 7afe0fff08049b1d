# Which part of 92f7d26 (every pallas_hopper kernel writing the step's [B, S, heads, D] layout)
# slowed head dim 128's default backward without a mask from 64K tokens (2026-12-03, seventh
# session: in one lease 88922ab, 92f7d26's parent, ran 32:32:128 128K fwd+bwd in 1,800.8 ms,
# 0.99x cuDNN, the library in 1,947.6 ms, 0.91x; the dq accumulator's layout is not it).
# Run 2026-12-04 at 9d5c297 (results and the fix adopted from them: ../hopper_runs_1204b/bisect.md);
# the patches apply to 9d5c297, not to later commits, which hold both.patch.
# The kernel changes of 92f7d26 left, each a patch on the library (applied to the device's copy of
# the tree, then reverted):
#   noscale.patch  dq tiles added unscaled and scaled after the kernel (the only change inside the
#                  loop of the default backward);
#   kvhead.patch   dk, dv written head-major [B, K, Sk, D] and transposed after the kernel;
#   both.patch     both;
#   old.patch      ringattention/ as of 88922ab (also the forward's o head-major).
# and a candidate fix, should the in-loop multiply be it:
#   dsscale.patch  ds^T scaled where it is computed, p (dp scale - delta scale), i.e. one FMA in
#                  place of a subtraction and a [c] vector multiply per pair: then dq = ds k
#                  (fused and one-tile-per-CTA kernels) and dk = ds^T q need no multiply at all
#                  (the deterministic and head-dim-256 kernels keep theirs).
# From the repository root on the device, R a results folder:
#   R=$OUT bash benchmarks/results/hopper_runs_1203g/bisect.sh time   (about 4 minutes)
#       fwd+bwd against cuDNN at SEQ (131072) without a mask, SHAPE (32:32:128), each variant
#       one hopper_check process (bisect_<variant>.txt), with nvidia-smi's SM clock and power
#       sampled every 250 ms (smi_<variant>.csv): under Nsight Compute the library's backward at
#       64K took as many cycles as hopper_runs_1202d's (518 against 513 million) at a lower clock
#       (1.55 against 1.59 GHz), with 4-6x the DRAM traffic;
#   R=$OUT bash benchmarks/results/hopper_runs_1203g/bisect.sh l2     (about 2 minutes)
#       Nsight Compute's SpeedOfLight and MemoryWorkloadAnalysis of the backward kernel at 64K:
#       the library's L2 hit rate was 88-90% this session against 98.7% in hopper_runs_1202d
#       (l2_<variant>.txt);
#   R=$OUT bash benchmarks/results/hopper_runs_1203g/bisect.sh ptxas  (about 1 minute)
#       ptxas's registers and spills of each variant's kernels (ptxas_<variant>.log.gz).
# VARIANTS overrides the list (default: library noscale kvhead both old dsscale; l2: library
# noscale old; ptxas: library noscale dsscale old).
set -u
D=benchmarks/results/hopper_runs_1203g
export PYTHONPATH=. XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
mkdir -p "${R:?R: results folder}"

variant() {  # variant NAME CMD...: runs CMD with NAME's patch applied
  local v=$1
  shift
  if [ "$v" != library ]; then git apply "$D/$v.patch" || patch -p1 < "$D/$v.patch" || return 1; fi
  "$@"
  if [ "$v" != library ]; then git apply -R "$D/$v.patch" || patch -R -p1 < "$D/$v.patch"; fi
}

case "${1:?time, l2 or ptxas}" in
time)
  for v in ${VARIANTS:-library noscale kvhead both old dsscale}; do
    nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits \
      -lms 250 > "$R/smi_$v.csv" 2>&1 &
    local_smi=$!
    variant "$v" timeout 120 python3 benchmarks/hopper_check.py --out "$R/bisect_$v" \
      --parts bench --reps 3 --rounds 1 --min-ms 300 --shapes "${SHAPE:-32:32:128}" \
      --seqs "${SEQ:-131072}" --causal 0 --backwards default --hard-limit 110 > /dev/null 2>&1
    kill "$local_smi" 2>/dev/null
    echo "== $v"
    grep "^time.*fwdbwd" "$R/bisect_$v.txt" | cut -c1-120
    # SM clock (MHz) and power (W) over the samples drawing more than 300 W (the timed calls)
    awk -F', *' '$2 > 300 {n++; c += $1; p += $2} END {if (n) printf "busy samples %d: SM %.0f MHz, %.0f W\n", n, c / n, p / n}' "$R/smi_$v.csv"
  done ;;
l2)
  for v in ${VARIANTS:-library noscale old}; do
    variant "$v" env -u XLA_PYTHON_CLIENT_MEM_FRACTION XLA_FLAGS="--xla_gpu_enable_command_buffer=" \
      XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 200 ncu --clock-control none \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats -f \
      --launch-skip 1 --launch-count 1 --kernel-name regex:mosaic --export "$R/l2_$v" \
      python3 benchmarks/hopper_profile.py --shape "${SHAPE:-32:32:128}" --seq 65536 --causal 0 \
      > "$R/l2_$v.log" 2>&1
    timeout -k 5 120 ncu --import "$R/l2_$v.ncu-rep" --page details --csv 2>&1 | gzip \
      > "$R/l2_$v.csv.gz"
    rm -f "$R/l2_$v.ncu-rep"
    python3 benchmarks/hopper_profile.py --summarize "$R/l2_$v.csv.gz" > "$R/l2_$v.txt" 2>&1
    echo "== $v"
    grep -E "Duration|Elapsed Cycles|SM Frequency|L2 Hit|DRAM Through|Spilling" "$R/l2_$v.txt"
  done ;;
ptxas)
  for v in ${VARIANTS:-library noscale dsscale old}; do
    variant "$v" env MOSAIC_GPU_DUMP_PTXAS=1 timeout 100 python3 benchmarks/hopper_profile.py \
      --shape "${SHAPE:-32:32:128}" --seq 1024 --causal 0 > "$R/ptxas_$v.log" 2>&1
    echo "== $v"
    python3 benchmarks/hopper_profile.py --ptxas "$R/ptxas_$v.log" | cut -c1-160
    gzip -f "$R/ptxas_$v.log"
  done ;;
esac
