# v3 forward overlap without ping-pong: device check, then the A/B at 16K-128K (d128, d64)
source "$(dirname "$0")/common.sh"
step timeout 230 python3 devrun/fo3b.py --out $R/fo3b_check --parts steps,ring --backwards default --hard-limit 220 \
  --cases gqa-d64,mha-d64,d128,d80,window300,window200-noncausal --ring-dims 64,128
NP=default/fwd_overlap=true/pingpong=false
step env MOSAIC_GPU_DUMP_PTXAS=1 timeout 440 python3 benchmarks/hopper_check.py --out $R/fo3b_d128 --parts bench --reps 5 --hard-limit 430 --shapes 32:8:128,32:32:128 --seqs 16384,65536,131072 --causal 0,1 --backwards default,$NP > $R/fo3b_d128_ptxas.log 2>&1
grep -h "time L" $R/fo3b_d128.txt | grep -v cudnn | awk '{print $2,$3,$4,$5,$(NF-2),$(NF-1),$NF, $7}'
step env MOSAIC_GPU_DUMP_PTXAS=1 timeout 330 python3 benchmarks/hopper_check.py --out $R/fo3b_d64 --parts bench --reps 5 --hard-limit 320 --shapes 32:8:64,32:32:64 --seqs 16384,65536,131072 --causal 0,1 --backwards default,$NP > $R/fo3b_d64_ptxas.log 2>&1
grep -h "time L" $R/fo3b_d64.txt | grep -v cudnn | awk '{print $2,$3,$4,$5,$(NF-2),$(NF-1),$NF, $7}'
grep -h -E "spill stores|C7513" $R/fo3b_*_ptxas.log | grep -v "ptxas warn" | sort | uniq -c
