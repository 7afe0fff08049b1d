# hopper_runs_1202c, first lease of 2026-12-02 (third session; planned in the second as
# benchmarks/lease_next_h200.sh). From the repository root: `bash benchmarks/results/hopper_runs_1202c/lease_c.sh`
# (it ran as a setsid job: its output is lease1.out, its files split_*; the time limits cut
# split_ab after seven of its eight cells and split_16k after three of its four; the cells left,
# and 32K, ran in the lease's second command, ab2/).
#   1. BlockSizes(split_group=True) (one key CTA per query head in the fused backward) on the
#      device against the float32 step reference: the GQA step cases at head dims 64 and 128
#      (causal, no mask, ids, fp16, ragged, a 1024 x 1536 step);
#   2. its A/B against the group loop where GQA drops (results: pallas_hopper_h200.md, 2026-12-02
#      second session): 32:8:64 and 32:8:128, 64K and 128K, full and causal, 3 interleaved rounds.
#      Expected from the MHA cells: 128K full 0.94x -> ~1.02x (64), 0.93x -> ~0.99x (128);
#   3. the same at 16K (the cost of the k/v repeat and the dk/dv sum where nothing spills from L2).
source benchmarks/lease_common.sh
step timeout 150 python3 benchmarks/hopper_check.py --out $R/split_check --parts steps --hard-limit 140 \
  --cases gqa-d64,gqa4-d64,gqa-d128 --backwards default,default/split_group=true
grep -h -E "^(PASS|FAIL|ERROR|SUMMARY)" $R/split_check.txt
step timeout 330 python3 benchmarks/hopper_check.py --out $R/split_ab --parts bench --reps 3 --rounds 3 \
  --hard-limit 320 --shapes 32:8:64,32:8:128 --seqs 131072,65536 --causal 0,1 \
  --backwards default,default/split_group=true
step timeout 60 python3 benchmarks/hopper_check.py --out $R/split_16k --parts bench --reps 5 --rounds 3 \
  --hard-limit 55 --shapes 32:8:64,32:8:128 --seqs 16384 --causal 0,1 \
  --backwards default,default/split_group=true
times $R/split_ab.txt $R/split_16k.txt
python3 benchmarks/hopper_table.py $R/split_ab.json $R/split_16k.json
pack
