# The one-H200 lease of 2026-12-02 (fifth session), as run: `overlap` (with bwd_overlap.patch
# applied; BlockSizes(bwd_overlap=...) is not in the library), then `step` as a setsid job, then
# `sass` (ncu segfaulted, no output). From the repository root on the device; every command ends
# well inside the 10-minute limit, so a machine handed back between two commands loses nothing but
# its start (the fourth session lost a setsid job that way).
#   1. `bash benchmarks/lease_next_h200.sh overlap` (about 6 minutes): BlockSizes(bwd_overlap=True),
#      FlashAttention-3's order of the head-dim-128 fused backward's last products (dv issued
#      before ds^T is staged, dq and dk together, dq's reduce-add staged while dk is in flight):
#      ptxas registers, spills and wgmma serialization warnings of the backward at 32:32:128
#      causal / full and 32:8:128 causal, default against overlap; the device check of the
#      head-dim-128 step cases with both; then the same-run A/B with causal masks
#      (32:32:128 at 16K/32K/64K, 32:8:128 at 32K/64K; 3 interleaved rounds);
#   2. `bash benchmarks/lease_next_h200.sh overlap_full` (about 5 minutes): the same A/B without
#      a mask, and 128K causal;
#   3. `bash benchmarks/lease_next_h200.sh sass` (about 3 minutes): where the default causal
#      head-dim-128 backward's warps wait, instruction by instruction (ncu's source page, one
#      launch at 32:32:128, 32K; ``hopper_profile.py --sass``);
#   4. `bash benchmarks/lease_next_h200.sh step` (about 14 minutes, longer than one command: only
#      as `OUT=/tmp/o setsid nohup bash benchmarks/lease_next_h200.sh step > /tmp/step.out 2>&1 &`
#      with a poll in the same and the next command that stops when the job is gone:
#        until [ -f /tmp/o/res.tgz ] || ! pgrep -f "[b]enchmarks/model.py"; do sleep 10; done
#      ): the 1,048,576-token training step of the 1B preset (offload_attn) with today's kernels
#      (the README's row, 691.7 s / 41.0% MFU, ran the two-kernel backward of 2026-12-01).
# Then copy the files under benchmarks/results/hopper_runs_<date>/.
source benchmarks/lease_common.sh  # (this file ran as benchmarks/lease_next_h200.sh)
AB="default,default/bwd_overlap=true"

ptxas() {  # ptxas of the pallas_hopper kernels at 1,024 tokens: shape, causal, backward spec
  local name="ptxas_${1//:/_}_c$2_${3//[\/=]/_}"
  env XLA_PYTHON_CLIENT_PREALLOCATE=false MOSAIC_GPU_DUMP_PTXAS=1 timeout 120 \
    python3 benchmarks/hopper_profile.py --shape "$1" --seq 1024 --causal "$2" --backward "$3" \
    > "$R/$name.log" 2>&1
  echo "== $name: $(python3 benchmarks/hopper_profile.py --ptxas "$R/$name.log" 2>&1 |
    grep -c .) kernels"
  python3 benchmarks/hopper_profile.py --ptxas "$R/$name.log" 2>&1 | tail -2
  grep -i -m3 "serializ\|C75" "$R/$name.log"
  gzip -f "$R/$name.log"
}

case "${1:?overlap, overlap_full, sass or step}" in
overlap)
  for spec in default default/bwd_overlap=true; do
    for sc in 32:32:128,1 32:32:128,0 32:8:128,1; do
      ptxas "${sc%,*}" "${sc#*,}" "$spec" &
    done
  done
  wait
  step timeout 200 python3 benchmarks/hopper_check.py --parts steps --cases d128 \
    --backwards "$AB" --hard-limit 190 --out "$R/check_d128"
  step timeout 330 python3 benchmarks/hopper_check.py --parts bench --causal 1 \
    --shapes 32:32:128@16384+32768+65536,32:8:128@32768+65536 --backwards "$AB" \
    --reps 3 --rounds 3 --hard-limit 320 --out "$R/ab_causal"
  times "$R/ab_causal.txt"
  pack ;;
overlap_full)
  step timeout 560 python3 benchmarks/hopper_check.py --parts bench --causal 0 \
    --shapes 32:32:128@16384+65536,32:8:128@32768+65536 --backwards "$AB" \
    --reps 3 --rounds 3 --hard-limit 400 --out "$R/ab_full"
  step timeout 150 python3 benchmarks/hopper_check.py --parts bench --causal 1 \
    --shapes 32:32:128@131072 --backwards "$AB" --reps 3 --rounds 2 --hard-limit 140 \
    --out "$R/ab_128k"
  times "$R/ab_full.txt" "$R/ab_128k.txt"
  pack ;;
sass)  # where the default causal head-dim-128 backward's warps wait (ncu's source page, 32K)
  step env -u XLA_PYTHON_CLIENT_MEM_FRACTION XLA_FLAGS="--xla_gpu_enable_command_buffer=" \
      XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 ncu --clock-control none \
      --section SourceCounters --section WarpStateStats --import-source yes -f --launch-count 1 \
      --kernel-name regex:scoped_mosaic --export $R/sass_c128_causal1 \
      python3 benchmarks/hopper_profile.py --shape 32:32:128 --seq 32768 --causal 1
  ncu --import $R/sass_c128_causal1.ncu-rep --page source --print-source sass --csv 2>&1 |
    gzip > $R/sass_c128_causal1.csv.gz
  python3 benchmarks/hopper_profile.py --sass $R/sass_c128_causal1.csv.gz > $R/sass_summary.txt 2>&1
  rm -f $R/sass_c128_causal1.ncu-rep
  head -60 $R/sass_summary.txt
  pack ;;
step)
  step timeout 1000 python3 benchmarks/model.py --seqs= --fit-seqs 1048576 --fit-remat offload_attn \
    --out $R/model_1m_step_offload_attn.json
  pack ;;
esac
