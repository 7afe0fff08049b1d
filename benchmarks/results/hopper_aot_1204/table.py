"""aot.md from run.sh's JSONs: per kernel, registers, spill bytes and the hot loops' per-trip
instructions and local-memory (spill) instructions, loop_descriptors off against on."""
import json
import re
import sys

rows = {}
for path in sys.argv[1:]:
    r = json.load(open(path))
    a = r["args"]
    backward, flag = a["backward"].split("/loop_descriptors=")
    for n, k in enumerate(r["kernels"]):
        loops = [re.match(r"loop \S+: (\d+) instructions, (\d+) HGMMA, (\d+) LDL, (\d+) STL", lp)
                 for lp in k["loops"]]
        trips = ", ".join(f"{m[1]} / {int(m[3]) + int(m[4])}" for m in loops if m)
        key = (backward, a["shape"], a["causal"], n)
        rows.setdefault(key, {})[flag] = (f"{k['spill_stores']} / {k['spill_loads']}", trips)
print("# The backward kernels compiled for an H200 without a GPU (2026-12-04, fourth session)\n")
print("jax 0.11.2 with jax-cuda13-plugin, ptxas 13.0 (`-arch=sm_90a`), nvdisasm 13.5; "
      "`benchmarks/hopper_aot.py` through `run.sh`. Every kernel: 168 registers at launch (240 per "
      "compute thread after `setmaxnreg`). Spills: bytes of stores / loads per thread (ptxas). "
      "Loops: each loop that issues wgmma, as instructions per trip / local-memory instructions "
      "(LDL + STL) per trip; a causal kernel has an unmasked and a masked loop, a GQA kernel with "
      "a mask also the loop over the group's heads around them (listed first). ptxas is not "
      "deterministic on every kernel: 32:8:128's causal default backward, the same PTX every "
      "time, assembles to 192 / 368 or 184 / 360 bytes of spills from one run to the next (6 and "
      "2 of 8 runs); with loop_descriptors it spilled nothing in any run.\n")
print("| backward | shape | causal | kernel | spills: library | with loop_descriptors | "
      "loops: library | with loop_descriptors |")
print("|---|---|---|---|---|---|---|---|")
for (backward, shape, causal, n), v in sorted(rows.items()):
    off, on = v.get("false", ("-", "-")), v.get("true", ("-", "-"))
    two = backward == "deterministic" or (backward == "default" and shape.endswith(":256"))
    kernel = ("dq" if n == 0 else "dk/dv") if two else "fused"
    print(f"| {backward} | {shape} | {causal} | {kernel} | {off[0]} | {on[0]} | {off[1]} | {on[1]} |")
