# One H200 lease, 2026-12-04 (third session), started with setsid from the repository root:
#   R=/tmp/resA BUDGET=1500 setsid bash benchmarks/results/hopper_runs_1204d/pipeline.sh \
#     > /tmp/resA.out 2>&1 &
# Each part gets at most its planned seconds and never runs past $R/deadline (start + BUDGET,
# rewritable while it runs); a part with less than MIN_PART seconds left is skipped.
# 1. smem_ds.py (../hopper_runs_1204c): dk's (and dv's) wgmma A operand from shared memory, head
#    dims 128 and 64, against the library; ptxas's C7519 notes per variant (head dim 128);
# 2. kv_layout.py: head dim 128's dk, dv in the step's layout against head-major, 16K-64K (128K
#    ran in hopper_runs_1204b: head-major 0.9% faster);
# 3. if dkv_smem is at most 1% slower: overlap_dq.py's overlap_smem and fa3_smem;
# 4. the winners (pick.py) patched in together (with_variant.py): the head-dim-128 grid next to
#    cuDNN and the device check of the default backward at head dims 64, 80 and 128; with no
#    winner, the head-dim-64 grid of the library (head dim 64's dq now scaled after the kernel)
#    and its device check.
# Writes $R/DONE at the end.
source benchmarks/lease_common.sh
C=benchmarks/results/hopper_runs_1204c
MIN_PART=90
echo $(( $(date +%s) + ${BUDGET:-1500} )) > "$R/deadline"


part 460 python3 $C/smem_ds.py --backwards default \
  --problems 32:32:128@16384+131072,32:8:128@131072,32:8:64@16384+131072 \
  --variants library,dk_smem,dkv_smem --rounds 3 --out "$R/smem_ds"
w_smem=$(python3 $C/pick.py "$R/smem_ds.json" 2> "$R/pick_smem_ds.txt") || w_smem=library
g_dkv=$(python3 $C/pick.py "$R/smem_ds.json" dkv_smem 2> /dev/null) || g_dkv=0
cat "$R/pick_smem_ds.txt"; echo "smem_ds winner: $w_smem" | tee -a "$R/pick_smem_ds.txt" "$R/lease.log"
if [ "$(left)" -gt 600 ]; then
  ptxas_variants $C/smem_ds.py ptxas_ dk_smem dkv_smem  # the library's: hopper_runs_1204c
  for v in dk_smem dkv_smem; do echo "== $v C7519: $(zcat "$R/ptxas_$v.log.gz" | grep -c C7519)"; done
fi

part 330 python3 $C/kv_layout.py --backwards default \
  --problems 32:32:128@16384+32768+65536,32:8:128@16384 --variants library,step --rounds 3 \
  --out "$R/kv_layout128"
w_kv=$(python3 $C/pick.py "$R/kv_layout128.json" 2> "$R/pick_kv_layout.txt") || w_kv=library
cat "$R/pick_kv_layout.txt"; echo "kv_layout winner: $w_kv" | tee -a "$R/pick_kv_layout.txt" "$R/lease.log"

w_ov=library
if python3 -c "import sys; sys.exit(float('$g_dkv') < 0.99)"; then
  part 420 python3 $C/overlap_dq.py --backwards default \
    --problems 32:32:128@16384+131072,32:8:128@131072 --variants library,overlap_smem,fa3_smem \
    --rounds 3 --out "$R/overlap_smem"
  w_ov=$(python3 $C/pick.py "$R/overlap_smem.json" 2> "$R/pick_overlap_smem.txt") || w_ov=library
  cat "$R/pick_overlap_smem.txt"; echo "overlap_smem winner: $w_ov" | tee -a "$R/lease.log"
fi

# the winners together: the better wgmma variant (by its own A/B's geometric mean), then layout
spec=""
if [ "$w_ov" != library ]; then
  g_ov=$(python3 $C/pick.py "$R/overlap_smem.json" "$w_ov")
  g_sm=1
  [ "$w_smem" != library ] && g_sm=$(python3 $C/pick.py "$R/smem_ds.json" "$w_smem")
  if python3 -c "import sys; sys.exit(float('$g_ov') <= float('$g_sm'))"; then
    spec="overlap_dq:$w_ov"
  else
    spec="smem_ds:$w_smem"
  fi
elif [ "$w_smem" != library ]; then
  spec="smem_ds:$w_smem"
fi
[ "$w_kv" != library ] && spec="${spec:+$spec+}kv_layout:$w_kv"
echo "patched in: ${spec:-nothing}" | tee -a "$R/lease.log"

if [ -n "$spec" ]; then
  part 420 python3 $C/with_variant.py "$spec" --out "$R/grid128_win" --parts bench --reps 3 \
    --rounds 3 --min-ms 300 --hard-limit "$(hl 420)" --shapes 32:8:128,32:32:128 \
    --seqs 16384,65536,131072 --causal 1,0 --backwards default
  times "$R/grid128_win.txt"
  part 300 python3 $C/with_variant.py "$spec" --out "$R/check_win" --parts steps,ring \
    --cases d64,d80,d128 --ring-dims 128,64 --backwards default --hard-limit "$(hl 300)"
  grep -h "FAIL\|ERROR\|SUMMARY" "$R/check_win.txt"
else
  part 300 python3 benchmarks/hopper_check.py --out "$R/check64" --parts steps,ring \
    --cases d64,d80 --ring-dims 64 --backwards default --hard-limit "$(hl 300)"
  grep -h "FAIL\|ERROR\|SUMMARY" "$R/check64.txt"
  part 420 python3 benchmarks/hopper_check.py --out "$R/grid64" --parts bench --reps 3 \
    --rounds 3 --min-ms 300 --hard-limit "$(hl 420)" --shapes 32:8:64,32:32:64 \
    --seqs 16384,65536,131072 --causal 1,0 --backwards default
  times "$R/grid64.txt"
fi
touch "$R/DONE"
