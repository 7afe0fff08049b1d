"""rotate.md, stage.md and order.md from run.sh's JSONs: per variant of rotate_dq.py, stage_ds.py or
overlap_dq.py, spills, ptxas's wgmma notes and the hot loops' per-trip instructions, local-memory
instructions and warpgroup syncs, loop_descriptors off and on. Usage: table.py SCRIPT JSON..."""
import json
import re
import sys

ORDER = ["library", "rotate", "rotate_overlap", "rotate_s", "rotate_0", "late", "early_wait",
         "late_early_wait", "dq_first", "dv_dq_dk", "overlap", "overlap_nested", "fa3", "fa3_nested"]
rows = []
for path in sys.argv[2:]:
    r = json.load(open(path))
    a, k = r["args"], r["kernels"][0]
    flag = a["backward"].split("/loop_descriptors=")[1]
    loops = [re.match(r"loop \S+: (\d+) instructions, (\d+) HGMMA, (\d+) LDL, (\d+) STL", lp)
             for lp in k["loops"]]
    # the JSON keeps a loop's 16 most frequent opcodes: a rarer WARPGROUP count is below the 16th
    syncs = lambda mix: mix.get("WARPGROUP", f"< {min(mix.values())}")  # noqa: E731
    trips = ", ".join(f"{m[1]} / {int(m[3]) + int(m[4])} / {syncs(mix)}"
                      for m, mix in zip(loops, k["opcodes"], strict=True) if m)
    notes = ", ".join(k["serialized"]) or "-"
    variant = a["variant"].split(":")[1]
    rows.append((a["shape"], ORDER.index(variant), a["causal"], flag, variant,
                 f"{k['spill_stores']} / {k['spill_loads']}", k["wgmma_notes"], notes, trips))
print(f"# {sys.argv[1]}'s variants compiled for an H200 without a GPU (2026-12-05)\n")
print("jax 0.11.2 with jax-cuda13-plugin, ptxas 13.0 (`-arch=sm_90a`); `benchmarks/hopper_aot.py` "
      "through `run.sh`, head dim 128's default backward (`hopper_cta_dq_bwd`). Spills: "
      "bytes of stores / loads per thread. C7519: ptxas's injected warpgroup arrives. Serialized: "
      "ptxas's note that every wgmma of the kernel is waited for right after its issue, with its "
      "code (C7512: insufficient register resources). Loops: instructions / local-memory "
      "instructions / `WARPGROUP` instructions (arrives and waits) per trip; a causal kernel has "
      "an unmasked and a masked loop, 32:8:128's causal kernel also the loop over the group's "
      "heads around them (listed first).\n")
print("| shape | variant | causal | loop_descriptors | spills | C7519 | serialized | loops |")
print("|---|---|---|---|---|---|---|---|")
for shape, _, causal, flag, *rest in sorted(rows, key=lambda r: (r[0] != "32:32:128", *r)):
    variant, spills, c7519, notes, trips = rest
    print(f"| {shape} | {variant} | {causal} | {flag} | {spills} | {c7519} | {notes} | {trips} |")
