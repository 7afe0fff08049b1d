# One-H200 lease commands for issue 16 (planned 2026-12-02, sixth session). From the repository
# root on the device. The fifth session's `sass` ran in the sixth session (results in
# benchmarks/results/hopper_runs_1202f/, section "2026-12-02 (sixth session)" of
# benchmarks/results/pallas_hopper_h200.md) and is kept here as the command that profiles a
# backward instruction by instruction:
#   `bash benchmarks/lease_next_h200.sh sass [SHAPE CAUSAL BACKWARD]` (about 1 minute; default
#   32:32:128 1 default): where the backward's warps wait (ncu's SourceCounters and
#   WarpStateStats, one launch at 32K, no source import: that segfaulted inside ncu in the fifth
#   session); `hopper_profile.py --sass` groups the samples by loop body.
# Run 2026-12-03 (third session; results in benchmarks/results/hopper_runs_1203c/, section
# "2026-12-03 (third session)" of pallas_hopper_h200.md):
#   `bash benchmarks/lease_next_h200.sh detprof [SHAPE CAUSAL]` (about 2.5 minutes; default
#   32:32:128 0): Nsight Compute's full set for the deterministic backward's two kernels next to
#   cuDNN's, at 64K (hopper_profile.py's recipe with --backward deterministic);
#   `bash benchmarks/lease_next_h200.sh detsass [SHAPE CAUSAL]` (about 1 minute): the dq and the
#   dk/dv kernel instruction by instruction at 32K, then ptxas's registers and spills. It showed
#   the dk/dv kernel waiting on its per-block loads of lse and delta.
# Run 2026-12-03 (fourth session; results in benchmarks/results/hopper_runs_1204/, section
# "2026-12-03 (fourth session)" of pallas_hopper_h200.md):
#   `bash benchmarks/lease_next_h200.sh kvcols` (about 3 minutes): the fused (default) backward
#   with lse2 alone loaded before its wgmmas, or delta loaded while dp^T is in flight
#   (benchmarks/results/hopper_runs_1204/kv_cols.py), against the library at head dim 128. Both
#   lost (1-7% slower).
# Run 2026-12-03 (fifth session; results in benchmarks/results/hopper_runs_1205/, section
# "2026-12-03 (fifth session)" of pallas_hopper_h200.md):
#   `bash benchmarks/lease_next_h200.sh rerun16k` (about 2 minutes): the 16K cells of the target
#   grid at head dim 128 with 5 interleaved passes, each measurement the median of at least 3 calls
#   spanning at least 300 ms (hopper_check.py --min-ms), default and deterministic.
# Planned 2026-12-03 (fourth session). In the fifth session Nsight Compute segfaulted on its first
# launch and nothing came back; the same recipe had worked in the sixth session of 2026-12-02:
#   `bash benchmarks/lease_next_h200.sh lagsass [CAUSAL]` (about 3 minutes; default 1): the
#   head-dim-128 fused backward instruction by instruction at 32K, the library's kernel and the one
#   with dq one pair late (hopper_runs_1204/lag_dq.patch, applied to the device's copy of the tree
#   and reverted). The lag spilled less and ran 3-10% slower; where its time goes says what holds
#   the head-dim-128 backward at 0.95-1.02x of cuDNN.
# Run 2026-12-03 (sixth session; results in benchmarks/results/hopper_runs_1203f/, section
# "2026-12-03 (sixth session)" of pallas_hopper_h200.md): `check` (104 PASS; "fused" added, which
# checks head dim 256's atomic backward), `grid 128` (about 8 minutes), `grid 64` (6 minutes, a
# fresh R). The grid found head dim 128 without a mask at 0.97x (64K) and 0.91x (128K): the step's
# layout of dq's reduce-adds, it said, and limited that to 16K tokens (wrong: see the seventh session).
# Run 2026-12-03 (seventh session; results in benchmarks/results/hopper_runs_1203g/, section
# "2026-12-03 (seventh session)" of pallas_hopper_h200.md): `dqlayout` (16K-64K, then 128K),
# `grid 128`, `ab256` and `dqprof`. The dq accumulator's layout timed the same at every length,
# so the sixth session's rule was removed; the parts `dqlayout` and `dqprof` (which set that
# rule's constant, hopper_runs_1203f/dq_layout.py) and `ab256` (no gain) are gone from this script.
# Run 2026-12-04 at 9d5c297 (results in benchmarks/results/hopper_runs_1204b/, bisect.md, and the
# section "2026-12-04" of pallas_hopper_h200.md): `bisect time`, `bisect ptxas`, `bisect l2`, then
# `grid 128` and `grid 64` with hopper_runs_1203g/both.patch applied, which the library then took.
# The `bisect` part needs a checkout of 9d5c297 (its patches apply there only).
# Planned 2026-12-03 (seventh session): which part of 92f7d26 made head dim 128's default
# backward 0.91x cuDNN at 128K without a mask (88922ab: 0.99x in the same lease), one R per
# machine:
#   `R=/tmp/resA bash benchmarks/lease_next_h200.sh bisect time` (about 4 minutes): the library,
#   dq scaled after the kernel, dk/dv head-major, both, 88922ab's kernels and ds scaled where it
#   is computed (a candidate fix), fwd+bwd at 128K
#   with nvidia-smi's clock and power per variant (hopper_runs_1203g/bisect.sh);
#   `... bisect l2` (about 2 minutes): Nsight Compute's L2 hit rate and DRAM traffic of the
#   backward at 64K for the library, dq scaled after the kernel, and 88922ab;
#   `... bisect ptxas` (about 1 minute): registers and spills of every variant;
#   then, if a variant wins, `grid 128` with it applied (`git apply` the patch first) or committed.
# Run 2026-12-04 at 25e88d4, 128K only (hopper_runs_1204b/kv_layout64.py; the part `kvlayout64` is
#   gone from this script, since the library took its winner): head dim 64's dk, dv in the step's
#   layout ran 0.3-2% faster than head-major.
# Run 2026-12-04 (second session; results in benchmarks/results/hopper_runs_1204c/, runs.md, and
#   the section "2026-12-04 (second session)" of pallas_hopper_h200.md) through
#   hopper_runs_1204c/pipeline.sh: overlap_dq.py (dq's wgmmas issued while dk, dv run: 2-9% slower,
#   not adopted), `check` (77 PASS; the 8 cases its limit cut ran after it with the ring at head dim 64, 36 PASS), `scale64`
#   (head dim 64's dq scaled after the kernel: adopted; the part is gone from this script), `rerun16k`.
# Run 2026-12-04 (third session; results in benchmarks/results/hopper_runs_1204d/, runs.md, and
#   the section "2026-12-04 (third session)" of pallas_hopper_h200.md) through
#   hopper_runs_1204d/pipeline.sh: smem_ds.py (dk's, dv's wgmma operand from shared memory: 0.69-1.03x,
#   not adopted; the parts `smemds` and `overlapsmem` are gone from this script), `kvlayout` at
#   16K-64K (the step's layout 1.6% faster in the bare backward at 16K, not visible in
#   forward+backward next to cuDNN; not adopted), the head-dim-64 check (22 PASS) and `grid 64`.
# Next (issue 16): head dim 128's forward+backward is at 0.97-1.00x (16K: 0.98-1.00x), the
#   deterministic backward at 0.95-0.99x, head dim 256 at 0.91-0.94x. Planned 2026-12-04 (fourth
#   session, no device lent). One command runs it all under a deadline, in this order, and stops
#   before timing if the check fails (dry-run on CPU with its PY=dry_py.sh):
#     R=/tmp/resA BUDGET=1500 setsid bash benchmarks/results/hopper_aot_1204/pipeline.sh \
#       > /tmp/resA.out 2>&1 &
#   or part by part, one R per machine:
#   `bash benchmarks/lease_next_h200.sh ldesc check` (about 5 minutes): BlockSizes(
#   loop_descriptors=True) (the wgmma descriptors of the loops' unchanging tiles built inside the
#   loops: no spills left in any backward kernel, head dims 64-256, when compiled for an H200 on a CPU
#   machine, benchmarks/results/hopper_aot_1204/aot.md) against the float32 reference on the
#   device, default and deterministic, every step case and the ring: wgmma runs only there;
#   `... ldesc grid 128` (about 9 minutes): the target grid at head dim 128, the default backward
#   with and without it interleaved in each round; `... ldesc grid 256` (head dim 256's dk/dv
#   kernel spilled 56-116 bytes); `... ldesc det 128`: the deterministic pair with and without
#   it; `... ldesc grid 64` last (the flag adds 20-50 instructions per trip where nothing
#   spilled, as at head dim 64: expected no gain);
#   `... ldesc ab` (about 3 minutes): with the flag, bwd_stages=3 (spilled 108-208 bytes before;
#   none with the flag) against the library;
#   `... ldesc stage` (about 7 minutes; added 2026-12-05, no device lent, and run before `ab` by
#   the pipeline): with the flag, hopper_aot_1205/stage_ds.py's variants of the fused backward
#   against the library (ds^T staged for dq while dv, dk run; dq issued before dv, dk and added
#   while they run; FA3's order with ds^T staged while dv runs; overlap_dq.py's two orders, which
#   lost 2-9% with their spills and a C7519 note per loop, with dq's accumulator allocated where
#   dq is issued): no spills and no ptxas note when compiled for an H200 (hopper_aot_1205/
#   stage.md, order.md), the library's gradients bit for bit in interpret mode;
#   `... sass 32:32:128 1 default/loop_descriptors=true` (about 1 minute): where its warps wait.
#   If it wins, `_DEFAULTS` / `_DETERMINISTIC_TILES` in pallas_hopper.py take it where it won.
#   Then `kvlayout` (about 4 minutes): the 32K-128K rerun of the step's layout with 5 rounds
#   that the third session's second machine start lost.
# Copy the files under benchmarks/results/hopper_runs_<date>/.
source benchmarks/lease_common.sh

# sass_profile NAME KERNEL_REGEX SKIP SHAPE CAUSAL BACKWARD: one launch (after SKIP matching ones)
# at 32K, ncu's SourceCounters and WarpStateStats, its SASS page as $R/NAME.csv.gz and
# hopper_profile.py --sass's summary as $R/NAME.txt.
sass_profile() {
  step env -u XLA_PYTHON_CLIENT_MEM_FRACTION XLA_FLAGS="--xla_gpu_enable_command_buffer=" \
      XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 200 ncu --clock-control none \
      --section SourceCounters --section WarpStateStats -f --launch-skip "$3" --launch-count 1 \
      --kernel-name "regex:$2" --export "$R/$1" \
      python3 benchmarks/hopper_profile.py --shape "$4" --seq 32768 --causal "$5" --backward "$6"
  timeout -k 5 120 ncu --import "$R/$1.ncu-rep" --page source --print-source sass \
    --csv 2>&1 | gzip > "$R/$1.csv.gz"
  timeout 60 python3 benchmarks/hopper_profile.py --sass "$R/$1.csv.gz" > "$R/$1.txt" 2>&1
  rm -f "$R/$1.ncu-rep"
}

case "${1:?ldesc, sass, detprof, detsass, kvcols, rerun16k, lagsass, check, grid, bisect or kvlayout}" in
ldesc)
  # BlockSizes(loop_descriptors=True) against the library: check | grid D | det D
  flag=loop_descriptors=true d=${3:-128}
  case "${2:?check, grid, det, stage or ab}" in
  check)
    step timeout 560 python3 benchmarks/hopper_check.py --out "$R/ldesc_check" --parts steps,ring \
      --backwards "default/$flag,deterministic/$flag" --ring-dims 128,64,256 --hard-limit 540
    grep -h "FAIL\|ERROR\|SUMMARY" "$R/ldesc_check.txt" ;;
  grid|det)
    name=default; [ "$2" = det ] && name=deterministic
    step timeout 590 python3 benchmarks/hopper_check.py --out "$R/ldesc_${2}$d" --parts bench \
      --reps 3 --rounds 3 --min-ms 300 --hard-limit 580 --shapes 32:8:$d,32:32:$d \
      --seqs 16384,65536,131072 --causal 1,0 --backwards "$name,$name/$flag"
    times "$R/ldesc_${2}$d.txt" ;;
  stage)
    # with the flag: the library against hopper_aot_1205/stage_ds.py's orders (ds^T staged while
    # dv, dk run; dq first and added while dv, dk run; dv, dq, dk; overlap_dq.py's two with dq's
    # accumulator where dq is issued), bare backward, rotated rounds
    step timeout 480 python3 benchmarks/results/hopper_aot_1205/stage_ds.py \
      --backwards "default/$flag" \
      --variants library,late_early_wait,dq_first,dv_dq_dk,overlap_nested,fa3_nested \
      --problems 32:32:128@16384+65536,32:8:128@65536 --rounds 3 --out "$R/stage_ab" ;;
  ab)
    # with the flag: 3 stages against the library's 2, bare backward (the two backwards are timed
    # one after the other; overlap_dq.py's orders run in `stage`)
    step timeout 240 python3 benchmarks/results/hopper_runs_1204c/overlap_dq.py \
      --backwards "default/$flag,default/$flag/bwd_stages=3" --variants library \
      --problems 32:32:128@16384+65536,32:8:128@65536 --rounds 3 --out "$R/ldesc_ab" ;;
  esac
  pack ;;
kvlayout)
  step timeout 300 python3 benchmarks/results/hopper_runs_1204c/kv_layout.py --backwards default \
    --problems 32:32:128@32768+65536+131072 --variants library,step --rounds 5 \
    --out "$R/kv_layout_long"
  pack ;;
check)
  # "fused" adds head dim 256's atomic backward (at 64 and 128 it is the default)
  step timeout 560 python3 benchmarks/hopper_check.py --out "$R/check" --parts steps,ring \
    --backwards default,deterministic,triton,fused --hard-limit 540
  grep -h "FAIL\|ERROR\|SUMMARY" "$R/check.txt"
  pack ;;
grid)
  d=${2:-128}
  step timeout 590 python3 benchmarks/hopper_check.py --out "$R/grid$d" --parts bench --reps 3 \
    --rounds 3 --min-ms 300 --hard-limit 580 --shapes 32:8:$d,32:32:$d --seqs 16384,65536,131072 \
    --causal 1,0 --backwards default,deterministic
  times "$R/grid$d.txt"
  pack ;;
bisect)
  # hopper_runs_1203g/bisect.sh MODE (time, l2 or ptxas); VARIANTS, SHAPE, SEQ as there
  R="$R" step bash benchmarks/results/hopper_runs_1203g/bisect.sh "${2:?time, l2 or ptxas}"
  pack ;;
lagsass)
  causal=${2:-1} patch=benchmarks/results/hopper_runs_1204/lag_dq.patch
  sass_profile "lagsass_lockstep_c$causal" scoped_mosaic 0 32:32:128 "$causal" default
  git apply "$patch" || patch -p1 < "$patch" || exit 1
  sass_profile "lagsass_lag_c$causal" scoped_mosaic 0 32:32:128 "$causal" default
  git apply -R "$patch" || patch -R -p1 < "$patch"
  for v in lockstep lag; do head -30 "$R/lagsass_${v}_c$causal.txt"; done
  pack ;;
rerun16k)
  step timeout 200 python3 benchmarks/hopper_check.py --out "$R/rerun16k" --parts bench --reps 3 \
    --min-ms 300 --rounds 5 --hard-limit 190 --shapes 32:32:128@16384,32:8:128@16384 \
    --causal 1,0 --backwards default,deterministic
  times "$R/rerun16k.txt"
  pack ;;
kvcols)
  step timeout 500 python3 benchmarks/results/hopper_runs_1204/kv_cols.py --backwards default \
    --variants library,lse_early,delta_mid --problems 32:32:128@16384+65536,32:8:128@65536 \
    --out "$R/kv_cols"
  ptxas_variants benchmarks/results/hopper_runs_1204/kv_cols.py ptxas_ library lse_early delta_mid
  pack ;;
detprof)
  shape=${2:-32:32:128} causal=${3:-0}
  name="detprof_${shape//:/_}_c${causal}"
  step env -u XLA_PYTHON_CLIENT_MEM_FRACTION XLA_FLAGS="--xla_gpu_enable_command_buffer=" \
      XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 400 ncu --clock-control none --set full \
      -f --launch-count 8 --kernel-name regex:"mosaic|sdpa|cudnn|fmha|flash" \
      --export "$R/$name" python3 benchmarks/hopper_profile.py --shape "$shape" --seq 65536 \
      --causal "$causal" --backward deterministic
  timeout -k 5 120 ncu --import "$R/$name.ncu-rep" --page details --csv 2>&1 | gzip \
    > "$R/$name.csv.gz"
  timeout 60 python3 benchmarks/hopper_profile.py --summarize "$R/$name.csv.gz" \
    > "$R/$name.txt" 2>&1
  rm -f "$R/$name.ncu-rep"
  cat "$R/$name.txt"
  pack ;;
detsass)
  # The deterministic backward's dq kernel (the second Mosaic launch) and dk/dv kernel (the
  # third), instruction by instruction as in sass, then ptxas's registers and spills per kernel.
  shape=${2:-32:32:128} causal=${3:-0}
  for which in 1:dq 2:dkv; do
    name="detsass_${shape//:/_}_c${causal}_${which#*:}"
    sass_profile "$name" mosaic "${which%:*}" "$shape" "$causal" deterministic
    head -45 "$R/$name.txt"
  done
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 200 python3 benchmarks/hopper_profile.py --shape "$shape" \
    --seq 1024 --causal "$causal" --backward deterministic > "$R/detsass_ptxas.log" 2>&1
  python3 benchmarks/hopper_profile.py --ptxas "$R/detsass_ptxas.log"
  pack ;;
sass)
  shape=${2:-32:32:128} causal=${3:-1} backward=${4:-default}
  name="sass_${shape//:/_}_c${causal}_${backward//[\/=]/_}"
  sass_profile "$name" scoped_mosaic 0 "$shape" "$causal" "$backward"
  cat "$R/$name.txt"
  pack ;;
esac
