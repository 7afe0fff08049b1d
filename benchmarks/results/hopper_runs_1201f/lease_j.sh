# the library's new defaults (head dim 128 without a causal mask: fwd_overlap, no ping-pong): device
# check of the non-causal d128 cases and the ring, then the default against the old forward
source "$(dirname "$0")/common.sh"
step timeout 200 python3 benchmarks/hopper_check.py --out $R/fo3c_check --parts steps,ring --backwards default --hard-limit 190 \
  --cases noncausal-gqa-d128,noncausal-seg-mha-d128,ragged-noncausal-mha-d128,window200-noncausal,long-causal-overlap-seg-gqa-d128 --ring-dims 128
step timeout 170 python3 benchmarks/hopper_check.py --out $R/fo3c_ab --parts bench --reps 5 --hard-limit 160 --shapes 32:8:128,32:32:128 --seqs 16384,65536 --causal 0 --backwards default,default/fwd_overlap=false/pingpong=true
grep -h "time L" $R/fo3c_ab.txt | grep -v cudnn | awk '{print $2,$3,$4,$5,$(NF-2),$(NF-1),$NF, $7}'
