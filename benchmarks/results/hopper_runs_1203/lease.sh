# The one-H200 leases of 2026-12-03, as run (order: tail, det; then on a second machine check and
# ab with out_dtype.patch applied to the tree, which is not in the library), from the repository
# root on the device, one command per part (R collects the outputs of one machine: lease_*.log):
#   tail: is the last partial wave of CTAs a cost? Without a mask every CTA of a kernel does the
#         same work; at 16K tokens 32 heads make 4,096 CTAs (128 query or key rows each), 31.03
#         waves on 132 SMs, so the last wave runs 4 CTAs alone. 33 heads make 4,224 = 32 x 132: if
#         waves matter, 33 heads take about as long as 32 (cuDNN's times grow by 33/32);
#   det:  the deterministic backward against cuDNN's deterministic one (XLA's
#         xla_gpu_deterministic_ops) and the default, same run; cuDNN's repeats, bit for bit.
#   check: the kernels writing o, dq, dk, dv in the input dtype and the [B, S, heads, D] layout
#         (out_dtype, a ring of one device) against the float32 step reference, both output
#         modes, and ring_attention on one device;
#   ab:   same-run A/B of the bare step, outputs in the input dtype (the patch's ring of one
#         device) against float32 outputs (the benchmark as it has always run), default and
#         deterministic.
# Then, on a third machine, with the patch applied (ring_one_device.json):
#   PYTHONPATH=. python3 benchmarks/results/hopper_runs_1203/ring_one_device.py \
#     --shapes 32:8:64@131072,32:32:128@16384 --rounds 2 --out $OUT/ring1
source benchmarks/lease_common.sh

case "${1:?tail, det, check or ab}" in
check)
  CASES=ragged-noncausal-gqa4-d64,causal-overlap-seg-gqa-d64,ragged-noncausal-mha-d128
  CASES=$CASES,ragged-causal-after-gqa-d192,noncausal-gqa-d128
  step timeout 300 python3 benchmarks/hopper_check.py --parts steps,ring --cases $CASES \
    --backwards default,deterministic,default/split_group=true --outputs input \
    --hard-limit 290 --out "$R/check_input"
  step timeout 200 python3 benchmarks/hopper_check.py --parts steps --cases $CASES \
    --backwards default --outputs float32 --hard-limit 190 --out "$R/check_f32"
  grep -h "FAIL\|ERROR\|SUMMARY\|SKIP" "$R"/check_*.txt
  pack ;;
ab)
  step timeout 560 python3 benchmarks/hopper_check.py --parts bench --causal 1,0 \
    --shapes 32:32:128@16384+65536,32:8:64@16384 --backwards default,deterministic \
    --outputs input,float32 --reps 3 --rounds 3 --hard-limit 540 --out "$R/ab"
  times "$R/ab.txt"
  pack ;;
tail)
  step timeout 400 python3 benchmarks/hopper_check.py --parts bench --causal 0 \
    --shapes 32:32:128@16384+32768,33:33:128@16384+32768,32:32:64@16384,33:33:64@16384 \
    --backwards default --reps 5 --rounds 3 --hard-limit 380 --out "$R/tail"
  times "$R/tail.txt"
  pack ;;
det)
  step timeout 300 python3 benchmarks/hopper_check.py --parts bench --causal 1,0 \
    --shapes 32:32:128@16384+65536 --backwards deterministic,default --cudnn-deterministic \
    --reps 3 --rounds 3 --hard-limit 280 --out "$R/det"
  step timeout 150 python3 benchmarks/hopper_check.py --parts repeat --causal 1 \
    --shapes 32:8:128@16384 --backwards deterministic,default --cudnn-deterministic \
    --hard-limit 140 --out "$R/det_repeat"
  times "$R/det.txt"
  grep -h "repeat\[" "$R/det_repeat.txt"
  pack ;;
esac
