# The one-H200 lease of 2026-12-03 (third session), from the repository root on the device, one
# command per part:
#   detprof: `bash benchmarks/lease_next_h200.sh detprof` (Nsight Compute's full set, the
#            deterministic backward's kernels next to cuDNN's, 64K);
#   detsass: `bash benchmarks/lease_next_h200.sh detsass` (instruction-level stalls of the dq and
#            the dk/dv kernel, 32K, and ptxas's registers and spills);
#   ab:      kv_init.py, lse and delta folded into the key-CTA kernels' accumulators (or loaded
#            before the wgmmas), library against the variants, deterministic and default backward,
#            then ptxas per variant (the hoist and init runs stopped with a KeyError after their
#            first problem's three kernels, since fixed in kv_init.py: ptxas_*.log.gz).
source benchmarks/lease_common.sh

case "${1:?ab}" in
ab)
  step timeout 480 python3 benchmarks/results/hopper_runs_1203c/kv_init.py \
    --problems "${2:-32:32:128@16384+65536,32:8:128@65536}" --out "$R/kv_init"
  for v in library hoist init; do
    MOSAIC_GPU_DUMP_PTXAS=1 timeout 100 python3 benchmarks/results/hopper_runs_1203c/kv_init.py \
      --problems 32:32:128@1024 --variants $v --rounds 1 --reps 1 --out "$R/tmp" \
      > "$R/ptxas_$v.log" 2>&1
    echo "== $v"; python3 benchmarks/hopper_profile.py --ptxas "$R/ptxas_$v.log" | cut -c1-160
    gzip -f "$R/ptxas_$v.log"
  done
  pack ;;
esac
