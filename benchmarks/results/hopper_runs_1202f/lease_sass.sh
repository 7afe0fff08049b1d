# One-H200 lease commands for issue 16 (planned 2026-12-02, fifth session; not run). From the
# repository root on the device. The fifth session's lease (the FA3-order backward that lost, the
# 1M-token step) is benchmarks/results/hopper_runs_1202e/lease.sh.
#   `bash benchmarks/lease_next_h200.sh sass` (about 3 minutes): where the default causal
#   head-dim-128 backward's warps wait, instruction by instruction (ncu's SourceCounters, one
#   launch at 32:32:128, 32K; `hopper_profile.py --sass`). The fifth session's try with
#   `--import-source yes` segfaulted inside ncu and then hung the command past its limit: this one
#   leaves the source import out and bounds every step with its own timeout.
# Then copy the files under benchmarks/results/hopper_runs_<date>/.
source benchmarks/lease_common.sh
case "${1:?sass}" in
sass)
  step env -u XLA_PYTHON_CLIENT_MEM_FRACTION XLA_FLAGS="--xla_gpu_enable_command_buffer=" \
      XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 200 ncu --clock-control none \
      --section SourceCounters --section WarpStateStats -f --launch-count 1 \
      --kernel-name regex:scoped_mosaic --export $R/sass_c128_causal1 \
      python3 benchmarks/hopper_profile.py --shape 32:32:128 --seq 32768 --causal 1
  timeout -k 5 120 ncu --import $R/sass_c128_causal1.ncu-rep --page source --print-source sass \
    --csv 2>&1 | gzip > $R/sass_c128_causal1.csv.gz
  timeout 60 python3 benchmarks/hopper_profile.py --sass $R/sass_c128_causal1.csv.gz \
    > $R/sass_summary.txt 2>&1
  rm -f $R/sass_c128_causal1.ncu-rep
  head -60 $R/sass_summary.txt
  pack ;;
esac
