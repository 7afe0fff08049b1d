#!/usr/bin/env bash
# Chunk-size sweep of the "xla" inner loop on one GPU (16K tokens, causal, H=32, D=128, bf16).
set -u
OUT=${OUT:-/tmp}
for b in q_chunk=512,kv_chunk=512 q_chunk=1024,kv_chunk=1024 q_chunk=2048,kv_chunk=1024 \
         q_chunk=2048,kv_chunk=2048 q_chunk=4096,kv_chunk=2048 q_chunk=4096,kv_chunk=4096; do
  python3 benchmarks/attention.py --impls xla --seqs 16384 --causal 1 --reps 5 --block "$b" \
    --out "$OUT/sweep_${b//[=,]/_}" 2>&1 | grep '^| ring'
done
