# One-H200 lease commands of 2026-12-03 (fifth session), from the repository root on the device:
#   `R=/tmp/res2 bash benchmarks/results/hopper_runs_1205/lease.sh heads` (about 5 minutes):
#   cta_heads.py, kv heads per key CTA 1 / 2 / 4 in the fused (default) backward;
#   `R=/tmp/res3 bash benchmarks/results/hopper_runs_1205/lease.sh ptxas` (about 1 minute): ptxas's
#   registers and spills of library, h2 and u2 (lease_common.sh's ptxas_variants);
#   `R=/tmp/res3 bash benchmarks/results/hopper_runs_1205/lease.sh unrolled` (about 3 minutes):
#   u2 and u4, the kv heads' code unrolled (UNROLL_HEADS, in the patch) instead of a fori_loop.
# Both need cta_heads.patch applied (`git apply benchmarks/results/hopper_runs_1205/cta_heads.patch`;
# the library had it while they ran; it lost and was taken out).
source benchmarks/lease_common.sh

case "${1:?heads, ptxas or unrolled}" in
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
