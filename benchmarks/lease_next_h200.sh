# One-H200 lease commands for issue 16 (planned 2026-12-02, third session). From the repository
# root on the device; the machine stays warm only 30 s between commands, and a setsid job dies
# with it when it is handed back (the fourth session lost the step that way):
#   1. `bash benchmarks/lease_next_h200.sh profile` (about 2 minutes; RAN in the fourth session,
#      results in benchmarks/results/hopper_runs_1202d/): Nsight Compute, clocks left alone, of our
#      backward and cuDNN's (forward and gradient kernels) at 32:32:128, 65,536 tokens, causal and
#      without a mask, summarized side by side (hopper_profile.py --summarize);
#   2. `bash benchmarks/lease_next_h200.sh sass` (about 2 minutes; not run): where the causal
#      backward's warps wait, instruction by instruction (ncu's source page, one launch at 32K;
#      hopper_profile.py --sass), to see how much of its L1TEX wait is the spills
#      (hopper_runs_1202d/spills.md) and what the rest is;
#   3. `OUT=/tmp/o setsid nohup bash benchmarks/lease_next_h200.sh step > /tmp/step.out 2>&1 &`,
#      then poll for /tmp/o/res.tgz and copy it and /tmp/step.out to $OUT (about 14 minutes; not
#      run), with a poll that stops when the job is gone (a fresh machine has neither; the
#      brackets keep pgrep from matching the poll's own command line):
#        until [ -f /tmp/o/res.tgz ] || ! pgrep -f "[b]enchmarks/model.py"; do sleep 10; done
#      the 1,048,576-token training step of the 1B preset (offload_attn) with today's kernels
#      (the README's row, 691.7 s / 41.0% MFU, ran the two-kernel backward of 2026-12-01).
# Then copy the files under benchmarks/results/hopper_runs_<date>/.
source benchmarks/lease_common.sh
case "${1:?profile, sass or step}" in
profile)
  for C in 1 0; do
    step env -u XLA_PYTHON_CLIENT_MEM_FRACTION XLA_FLAGS="--xla_gpu_enable_command_buffer=" \
        XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 110 ncu --clock-control none \
        --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
        --section MemoryWorkloadAnalysis -f --launch-count 8 \
        --kernel-name regex:"mosaic|sdpa|cudnn|fmha|flash" --export $R/c128_causal$C \
        python3 benchmarks/hopper_profile.py --shape 32:32:128 --seq 65536 --causal $C
    ncu --import $R/c128_causal$C.ncu-rep --page details --csv > $R/c128_causal$C.csv 2>&1
    python3 benchmarks/hopper_profile.py --summarize $R/c128_causal$C.csv > $R/c128_causal${C}_summary.txt 2>&1
    rm -f $R/c128_causal$C.ncu-rep
    head -40 $R/c128_causal${C}_summary.txt
  done
  pack ;;
sass)
  step env -u XLA_PYTHON_CLIENT_MEM_FRACTION XLA_FLAGS="--xla_gpu_enable_command_buffer=" \
      XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 ncu --clock-control none \
      --section SourceCounters --section WarpStateStats --import-source yes -f --launch-count 1 \
      --kernel-name regex:scoped_mosaic --export $R/sass_c128_causal1 \
      python3 benchmarks/hopper_profile.py --shape 32:32:128 --seq 32768 --causal 1
  ncu --import $R/sass_c128_causal1.ncu-rep --page source --print-source sass --csv 2>&1 |
    gzip > $R/sass_c128_causal1.csv.gz
  python3 benchmarks/hopper_profile.py --sass $R/sass_c128_causal1.csv.gz > $R/sass_summary.txt 2>&1
  rm -f $R/sass_c128_causal1.ncu-rep
  head -45 $R/sass_summary.txt
  pack ;;
step)
  step timeout 1000 python3 benchmarks/model.py --seqs= --fit-seqs 1048576 --fit-remat offload_attn \
    --out $R/model_1m_step_offload_attn.json
  pack ;;
esac
