# One-H200 lease commands of 2026-12-03 (fifth session), from the repository root on the device:
#   `R=/tmp/res2 bash benchmarks/results/hopper_runs_1205/lease.sh heads` (about 5 minutes):
#   cta_heads.py, kv heads per key CTA 1 / 2 / 4 in the fused (default) backward;
#   `R=/tmp/res3 bash benchmarks/results/hopper_runs_1205/lease.sh ptxas` (about 1 minute): ptxas's
#   registers and spills of library, h2 and u2 (lease_common.sh's ptxas_variants);
#   `R=/tmp/res3 bash benchmarks/results/hopper_runs_1205/lease.sh unrolled` (about 3 minutes):
#   u2 and u4, the kv heads' code unrolled (UNROLL_HEADS, in the patch) instead of a fori_loop;
#   `R=/tmp/res5 bash benchmarks/results/hopper_runs_1205/lease.sh kernels` (about 3 minutes, the
#   library as committed): every kernel's duration at 16K causal, ours and cuDNN's;
#   `R=/tmp/res6 bash benchmarks/results/hopper_runs_1205/lease.sh layout` (about 4 minutes, with
#   layout.patch applied, before it landed in the library): the outputs' layout from the kernels,
#   checked on the device and timed against the library (the patch reversed in a copy of the tree).
# heads, ptxas and unrolled need cta_heads.patch applied (`git apply benchmarks/results/hopper_runs_1205/cta_heads.patch`;
# the library had it while they ran; it lost and was taken out).
source benchmarks/lease_common.sh

case "${1:?heads, ptxas, unrolled, kernels or layout}" in
layout)
  # The step's outputs in their [B, S, heads, D] layout straight from the kernels (layout.patch,
  # applied in the tree this runs in): the device check of every step case, then the 16K cells of
  # head dim 128 with it and without it (the patch reversed in a copy), each against cuDNN.
  step timeout 150 python3 benchmarks/hopper_check.py --out "$R/check" --parts steps --hard-limit 130
  bench() {
    step timeout 130 python3 benchmarks/hopper_check.py --out "$R/$1" --parts bench --reps 3 \
      --min-ms 300 --rounds 3 --hard-limit 120 --shapes 32:32:128@16384,32:8:128@16384 \
      --causal 1,0 --backwards default,deterministic
  }
  bench layout16k
  rm -rf /tmp/old && mkdir /tmp/old && cp -r ringattention benchmarks /tmp/old/ \
    && (cd /tmp/old && patch -s -R -p1 < benchmarks/results/hopper_runs_1205/layout.patch \
    && PYTHONPATH=/tmp/old bench library16k)
  times "$R/layout16k.txt" "$R/library16k.txt"
  pack ;;
kernels)
  # Every kernel of hopper_profile.py's four calls (our forward, our backward step, cuDNN's forward,
  # cuDNN's gradient) at 16K causal with its duration (Nsight Compute's SpeedOfLight section; XLA's
  # autotuning off so that no launch goes to it): where the step's time goes, kernel by kernel.
  for shape in 32:32:128 32:8:128; do
    name="kernels_${shape//:/_}_16k_c1"
    step env -u XLA_PYTHON_CLIENT_MEM_FRACTION \
        XLA_FLAGS="--xla_gpu_enable_command_buffer= --xla_gpu_autotune_level=0" \
        XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 200 ncu --clock-control none \
        --section SpeedOfLight -f --launch-count 80 --export "$R/$name" \
        python3 benchmarks/hopper_profile.py --shape "$shape" --seq 16384 --causal 1
    timeout -k 5 120 ncu --import "$R/$name.ncu-rep" --page details --csv 2>&1 | gzip \
      > "$R/$name.csv.gz"
    rm -f "$R/$name.ncu-rep"
    # (as run, a zcat | grep | cut of the CSV here printed the names without the durations; the
    # kernels_*.txt beside this script are hopper_profile.py --durations of the CSVs, run after)
    python3 benchmarks/hopper_profile.py --durations "$R/$name.csv.gz" | tee "$R/$name.txt"
  done
  pack ;;
ptxas)
  ptxas_variants benchmarks/results/hopper_runs_1205/cta_heads.py ptxas_ library h2 u2
  pack ;;
unrolled)
  step timeout 400 python3 benchmarks/results/hopper_runs_1205/cta_heads.py --backwards default \
    --problems 32:32:128@16384+65536,32:32:64@16384 --variants library,u2,u4 --out "$R/unrolled"
  pack ;;
heads)
  step timeout 540 python3 benchmarks/results/hopper_runs_1205/cta_heads.py --backwards default \
    --problems 32:32:128@16384+65536,32:32:64@16384 --variants library,h2,h4 --out "$R/cta_heads"
  pack ;;
esac
