# hopper_runs_1202c, the first lease's second command (sent as one line; R=/tmp/res2 there): the
# A/B cells lease_c.sh's time limits left out (32:8:128 at 64K), and 32K and 16K, for the rule of
# BlockSizes(split_group=None). "default" here is the defaults before that rule: split_group=False.
source benchmarks/lease_common.sh
R=/tmp/res2; mkdir -p $R
step timeout 300 python3 benchmarks/hopper_check.py --out $R/ab128 --parts bench --reps 3 --rounds 3 \
  --hard-limit 290 --shapes 32:8:128 --seqs 65536,32768,16384 --causal 0,1 \
  --backwards default,default/split_group=true > /dev/null
step timeout 200 python3 benchmarks/hopper_check.py --out $R/ab64 --parts bench --reps 3 --rounds 3 \
  --hard-limit 190 --shapes 32:8:64 --seqs 32768,16384 --causal 1,0 \
  --backwards default,default/split_group=true > /dev/null
times $R/ab128.txt $R/ab64.txt
python3 benchmarks/hopper_table.py $R/ab128.json $R/ab64.json
pack
