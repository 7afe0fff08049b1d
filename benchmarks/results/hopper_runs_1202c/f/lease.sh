# hopper_runs_1202c, the third lease's second command (same machine, R=/tmp/res, so its pack also
# held e/'s files): registers per compute thread at head dim 128 with a causal mask, the cells
# below 0.98x (32K, 64K), 240 (the default) against 232 and 224.
source benchmarks/lease_common.sh
step timeout 200 python3 benchmarks/hopper_check.py --out $R/reg128 --parts bench --reps 3 --rounds 3 \
  --hard-limit 190 --shapes 32:32:128,32:8:128 --seqs 32768,65536 --causal 1 \
  --backwards default,default/registers=232,default/registers=224 > /dev/null
times $R/reg128.txt | grep fwdbwd
python3 benchmarks/hopper_table.py $R/reg128.json
pack
