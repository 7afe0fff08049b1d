#!/usr/bin/env bash
# One H100/H200 run (jax >= 0.11, no network, ~6.5 minutes) for issue 16's head-dim-256 backward,
# the deterministic two-kernel backward and the one-dq-tile-per-CTA option of the fused backward
# (written for the defaults of the morning of 2026-12-01; since its run the defaults are dq_tile=cta
# at head dims <= 128 and the "mosaic" split pair at 256, so "default" below names those):
#
#   1. check: every new kernel against the float32 step reference (PASS/FAIL lines): the
#      head-dim-split backwards (hopper_split_bwd: the fused default and the deterministic
#      "mosaic" pair of kernels) with the head-dim-256 forward (causal with segment ids and GQA;
#      non-causal, 4 query heads per kv head, ragged shards), and at head dim 128
#      the fused backward with dq_tile=cta at 2 and 3 stages next to the default fused and the
#      two-kernel "mosaic" one (a 1024 x 1536 GQA step with segment ids); ptxas register and spill
#      lines of every compiled kernel in check_log.txt (in compile order, between the RUN lines);
#   2. d256: the step at head dim 256 (default BlockSizes: forward block_k=64, the split backward)
#      next to cuDNN: 16:16:256 and 32:8:256 heads, 16K and 64K tokens, causal and full;
#   3. det: at 64K tokens, causal and full, the deterministic two-kernel backward ("mosaic") and the
#      default one (fused at head dim 128; at 64 the default is "mosaic" itself, timed once), and at
#      128 the fused one with dq_tile=cta (the A/B of one dq tile per CTA), next to cuDNN; shapes in
#      the order 32:8:128, 32:8:64, 32:32:64, 32:32:128, so a run cut short by its time limit loses
#      the last one.
#
#   bash benchmarks/hopper_issue16.sh "$OUT"     # from the repository root
#
# PYTHON (default python3) runs it; HC_EXTRA (optional) is appended to every hopper_check.py call.
# A CPU dry run of the plumbing (interpret mode, one cheap case, no timing):
#   XLA_FLAGS=--xla_force_host_platform_device_count=8 PYTHON=.venv/bin/python \
#   HC_EXTRA="--interpret --cases causal-before-gqa-d64" bash benchmarks/hopper_issue16.sh /tmp/out
# writes check.{json,txt}, check_log.txt, d256.{json,txt}, det.{json,txt} under $OUT (7 files).
# Each part has a hard limit (150 + 170 + 160 s, a watchdog
# writes what there is and moves on); each starts no new timing 40 s before its limit, so the whole
# run takes about 6.5 minutes and at most 8.
set -u
out=${1:?usage: hopper_issue16.sh OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=.
hc=benchmarks/hopper_check.py
py=${PYTHON:-python3}

MOSAIC_GPU_DUMP_PTXAS=1 "$py" "$hc" --out "$out/check" --parts steps --hard-limit 150 \
  --cases causal-overlap-seg-gqa-d256,ragged-noncausal-gqa4-d256,long-causal-overlap-seg-gqa-d128 \
  --backwards default,mosaic,fused/dq_tile=cta,fused/dq_tile=cta/bwd_stages=3 ${HC_EXTRA:-} \
  > "$out/check_log.txt" 2>&1
grep -E "^(PASS|FAIL|ERROR|SUMMARY|WATCHDOG)" "$out/check.txt"

"$py" "$hc" --out "$out/d256" --parts bench --reps 3 --hard-limit 170 \
  --shapes 16:16:256,32:8:256 --seqs 16384,65536 --causal 1,0 --backwards default ${HC_EXTRA:-} \
  | grep -E "^(time|ERROR|SUMMARY|WATCHDOG)"

"$py" "$hc" --out "$out/det" --parts bench --reps 3 --hard-limit 160 \
  --shapes 32:8:128,32:8:64,32:32:64,32:32:128 --seqs 65536 --causal 1,0 \
  --backwards default,mosaic,fused/dq_tile=cta ${HC_EXTRA:-} \
  | grep -E "^(time|note|ERROR|SUMMARY|WATCHDOG)"
