"""Compile the Hopper kernels for an H200 on a machine without a GPU, and read their registers,
spills and hot loops.

XLA's GPU plugin compiles without a device when it is given a topology and a target config (the
device description an H200 would report; ``H200_TARGET_CONFIG`` below). Mosaic GPU lowers each
kernel to PTX during that compile; this script has it dump the PTX (``MOSAIC_GPU_DUMP_TO``,
``MOSAIC_GPU_DUMP_PTX``), runs ``ptxas -arch=sm_90a -v`` on it (registers, spill bytes: the
numbers ``MOSAIC_GPU_DUMP_PTXAS=1`` prints on the device) and ``nvdisasm`` on the cubin, and
summarizes the loops that issue wgmma (``sass_loops.py``: instructions, and the spill loads and
stores paid on every trip). Nothing runs, so nothing here is a time: it says where registers go,
before a device run measures what that costs.

Setup: ``make aot`` builds ``.venv-aot`` (Python 3.12, the GPU machine's jax 0.11.2 with
``jax-cuda13-plugin`` and ``-pjrt``, ptxas 13.0 as on the device from ``nvidia-cuda-nvcc``,
``nvidia-cuda-nvdisasm``) and runs this script with ``ARGS``. Checked against the device: the
default head-dim-128 backward compiles to 168 registers and 296 / 336 bytes of spill stores / loads
at 32:32:128 with a causal mask, 192 / 368 at 32:8:128, 112 / 108 without one, as ptxas reported on
the H200 (docs/kernels.md). ptxas is not deterministic on every kernel:
the PTX of 32:8:128's causal backward (the same bytes every time) assembled to 192 / 368 bytes of
spills in 6 of 8 runs of ptxas and to 184 / 360 in 2; the other kernels checked came out the same
every time.

  make aot ARGS="--shape 32:32:128 --causal 1 --part bwd"
  make aot ARGS="--backward mosaic/bwd_stages=3 --json out.json"
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

H200_TARGET_CONFIG = """gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 4800000000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 150000000000
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {
    major: 9
  }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info {
  major: 9
  minor: 8
}
device_description_str: "NVIDIA H200"
"""


def _tool(name: str) -> str:
    """A CUDA tool from this virtualenv's NVIDIA wheels (``make aot``), else from PATH."""
    import sysconfig

    own = os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "cu13", "bin", name)
    return own if os.path.exists(own) else shutil.which(name) or name


def h200_device():
    """A compile-only H200 (XLA's deviceless compile: topology + target config)."""
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")  # no CUDA runtime to check
    from jax._src import xla_bridge
    from jax.experimental import topologies

    xla_bridge._discover_and_register_pjrt_plugins()
    topo = topologies.get_topology_desc(platform="cuda", topology="1x1x1", target_config=H200_TARGET_CONFIG)
    return topo.devices[0]


def compile_step(args, device) -> None:
    """Compiles the forward or backward step of ``args`` for ``device`` (outputs nothing)."""
    import hopper_run
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    from ringattention.kernels.hopper import pallas_hopper as ph

    h, kvh, d, *rest = (int(x) for x in args.shape.split(":"))
    dv = rest[0] if rest else d  # v's own head dim (MLA: 32:32:192:128)
    causal = bool(args.causal)
    bs = hopper_run.block_sizes(args.backward, d, causal, v_head_dim=dv)
    sh = SingleDeviceSharding(device)
    spec = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=sh)  # noqa: E731
    q, k = spec((1, args.seq, h, d), jnp.bfloat16), spec((1, args.seq, kvh, d), jnp.bfloat16)
    pos, lse = spec((args.seq,), jnp.int32), spec((1, h, args.seq), jnp.float32)
    kw = dict(causal=causal, softmax_scale=d**-0.5, block_sizes=bs)
    if args.softcap:
        kw["softcap"] = args.softcap

    def fwd(q, k, v, p):
        return ph.forward_step(q, k, v, p, p, None, None, **kw)

    def bwd(q, k, v, do, lse, delta, p):
        return ph.backward_step(q, k, v, do, lse, delta, p, p, None, None, **kw)

    v, do = spec((1, args.seq, kvh, dv), jnp.bfloat16), spec((1, args.seq, h, dv), jnp.bfloat16)
    fn, inputs = (fwd, (q, k, v, pos)) if args.part == "fwd" else (bwd, (q, k, v, do, lse, lse, pos))
    jax.jit(fn).trace(*inputs).lower().compile()


def ptxas_info(log: str) -> dict:
    """Registers, spill stores / loads (bytes) and stack frame from ``ptxas -v`` output."""
    import re

    out = {}
    for key, pattern in (
        ("registers", r"Used (\d+) registers"),
        ("spill_stores", r"(\d+) bytes spill stores"),
        ("spill_loads", r"(\d+) bytes spill loads"),
        ("stack_frame", r"(\d+) bytes stack frame"),
    ):
        m = re.search(pattern, log)
        out[key] = int(m.group(1)) if m else None
    # e.g. C7519, "warpgroup.arrive is injected ... to allow use of registers in GMMA": a fence
    # ptxas adds because a register operand of an in-flight wgmma is touched
    out["wgmma_notes"] = sum("C7519" in line or "warpgroup.arrive" in line for line in log.splitlines())
    # e.g. C7512 "... serialized due to insufficient register resources", C7514 "... due to non
    # wgmma instructions reading accumulator registers ...": ptxas waits for every wgmma right
    # after issuing it, in the whole kernel (the worst outcome; the code of the reason is kept)
    out["serialized"] = sorted(
        set(
            re.findall(
                r"\((C75\d\d)\) Potential Performance Loss: "
                r"wgmma\.mma_async instructions are serialized",
                log,
            )
        )
    )
    return out


def analyze(ptx_path: str, ptxas: str, nvdisasm: str) -> dict:
    """ptxas's numbers and the hot loops of one dumped kernel."""
    import sass_loops

    cubin = ptx_path[:-4] + ".cubin"
    log = subprocess.run(
        [ptxas, "-arch=sm_90a", "-v", ptx_path, "-o", cubin], capture_output=True, text=True, check=True
    ).stderr
    sass = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True, check=True).stdout
    with open(ptx_path[:-4] + ".sass", "w") as f:
        f.write(sass)
    loops = sass_loops.loops(sass)
    return dict(
        kernel=os.path.basename(ptx_path),
        **ptxas_info(log),
        loops=[lp.row() for lp in loops],
        opcodes=[dict(sass_loops.opcode_mix(sass, lp)) for lp in loops],
        total=sass_loops.summary(sass)[0],
    )


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shape", default="32:32:128", help="heads:kv_heads:head_dim[:v_head_dim]")
    ap.add_argument("--seq", type=int, default=4096, help="tokens (the kernels do not depend on it)")
    ap.add_argument("--causal", type=int, choices=(0, 1), default=1)
    ap.add_argument("--part", choices=("fwd", "bwd"), default="bwd")
    ap.add_argument("--softcap", type=float, default=None, help="logits' soft cap (Gemma 2: 50)")
    ap.add_argument(
        "--backward",
        default="default",
        help="as hopper_check.py --backwards: default, deterministic, name/field=value",
    )
    ap.add_argument("--keep", metavar="DIR", help="keep the PTX, cubin and SASS here")
    ap.add_argument("--json", metavar="FILE", help="write the results here")
    ap.add_argument("--ptxas", default=_tool("ptxas"), help="default: the venv's, else PATH's")
    ap.add_argument("--nvdisasm", default=_tool("nvdisasm"))
    args = ap.parse_args(argv)

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    dump = args.keep or tempfile.mkdtemp(prefix="hopper_aot_")
    os.makedirs(dump, exist_ok=True)
    os.environ["MOSAIC_GPU_DUMP_TO"], os.environ["MOSAIC_GPU_DUMP_PTX"] = dump, "1"
    compile_step(args, h200_device())
    results = [analyze(p, args.ptxas, args.nvdisasm) for p in sorted(glob.glob(f"{dump}/*.ptx"))]
    if not results:
        raise SystemExit(f"no PTX was dumped to {dump}: is a CUDA plugin of jax installed?")
    for r in results:
        print(
            f"{args.shape} causal={args.causal} {args.part} {args.backward}"
            f" {r['kernel']}: {r['registers']} registers, spills {r['spill_stores']} / "
            f"{r['spill_loads']} bytes (stores / loads), {r['wgmma_notes']} C7519 notes"
            + (f", wgmma SERIALIZED ({', '.join(r['serialized'])})" if r["serialized"] else "")
            + "\n"
            f"  {r['total']}"
        )
        for row, mix in zip(r["loops"], r["opcodes"], strict=True):
            print(f"  {row}\n    per trip: " + ", ".join(f"{k} {v}" for k, v in mix.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), kernels=results), f, indent=1)
    if not args.keep:
        shutil.rmtree(dump)
    return results


if __name__ == "__main__":
    main()
