# The next one-H200 lease for issue 16 (planned 2026-12-02, third session; not run yet). From the
# repository root on the device, in two commands sent back to back (the machine stays warm 30 s):
#   1. `bash benchmarks/lease_next_h200.sh profile` (about 4 minutes): Nsight Compute, clocks left
#      alone, of our backward and cuDNN's (forward and gradient kernels) at 32:32:128, 65,536
#      tokens, causal (0.97-0.98x, where the causal head-dim-128 gap is widest) and the same
#      without a mask (0.99x): issue rate, warp stalls, spills, L2/DRAM side by side
#      (hopper_profile.py --summarize), to find what the causal kernel waits on;
#   2. `OUT=/tmp/o setsid nohup bash benchmarks/lease_next_h200.sh step > /tmp/step.out 2>&1 &`,
#      then poll for /tmp/o/res.tgz and copy it and /tmp/step.out to $OUT (about 14 minutes):
#      the 1,048,576-token training step of the 1B preset (offload_attn) with today's kernels
#      (the README's row, 691.7 s / 41.0% MFU, ran the two-kernel backward of 2026-12-01).
# Then copy the files under benchmarks/results/hopper_runs_<date>/.
source benchmarks/lease_common.sh
case "${1:?profile or step}" in
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
step)
  step timeout 1000 python3 benchmarks/model.py --seqs= --fit-seqs 1048576 --fit-remat offload_attn \
    --out $R/model_1m_step_offload_attn.json
  pack ;;
esac
