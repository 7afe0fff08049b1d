# hopper_runs_1202c, third lease (one command): the cells of lease_d.sh's grid its time limit left
# out, 32:8:128 at 32K and 64K, with the defaults (BlockSizes(split_group=None)).
source benchmarks/lease_common.sh
step timeout 230 python3 benchmarks/hopper_check.py --out $R/gqa_rest --parts bench --reps 3 --rounds 3 \
  --hard-limit 220 --shapes 32:8:128 --seqs 65536,32768 --causal 1,0 --backwards default > /dev/null
times $R/gqa_rest.txt
python3 benchmarks/hopper_table.py $R/gqa_rest.json
pack
