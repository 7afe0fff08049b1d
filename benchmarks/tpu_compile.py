"""Ring attention and full training steps compiled for TPU slices on a CPU host, by the TPU compiler.

The TPU counterpart of ``memory_table.py`` (and of MaxText's ``train_compile.py``): with the libtpu
that matches the installed jax (``pip install "jax[tpu]==<jax version>"``), ``jax.experimental.
topologies`` gives the devices of a named slice (``v5e:2x2``, ``v5p:4x4x4``, ...) and ``jit(...).
lower(...).compile()`` runs the TPU compiler for them here, no TPU attached. Two parts:

- ``ring``: ``ring_attention`` forward and gradients (``implementation="auto"``, which is
  ``pallas_tpu`` on a TPU mesh, and ``xla``) in a ``shard_map`` over the slice, for head dims
  64/128/256, GQA, causal zigzag and packed segment ids: compiles or not, the kernel's block sizes,
  the compiler's per-chip temporaries.
- ``train``: the AdamW training step (forward, backward, update) of the 1b/8b/70b presets at
  128K-4M tokens with the sequence over the whole slice (ring; "usp" rows: Ulysses x ring), remat
  "full", attention "auto": the compiler's per-chip peak (arguments + outputs + temporaries -
  donated aliases) against the chip's HBM, its FLOP count, and the longest context that fits.

    python benchmarks/tpu_compile.py                     # both parts, the default plan (~30 min)
    python benchmarks/tpu_compile.py --part ring --slices v5e:2x2
    python benchmarks/tpu_compile.py --part train --plan 1b@v5e:2x2 --seqs 131072

Writes benchmarks/results/tpu_compile.json and tpu_compile.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import ringattention as ra  # noqa: E402
from models import llama  # noqa: E402
from models.sharding import MeshConfig, make_mesh  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
GIB = 2**30
# HBM per chip (GiB), from the vendor's TPU pages: v4 32, v5e 16, v5p 95, v6e 32.
HBM_PER_CHIP = {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32}
# (preset, slice, usp): each preset on a single host and on a larger slice; usp > 1 adds Ulysses.
DEFAULT_PLAN = ("1b@v5e:2x2", "8b@v5p:2x2x1", "8b@v6e:4x4@usp4", "70b@v5p:4x4x4", "70b@v5e:16x16")
DEFAULT_SEQS = "131072,262144,524288,1048576,2097152,4194304"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("ring", "train", "both"), default="both")
    p.add_argument("--slices", default="v5e:2x2,v5p:2x2x1,v6e:2x2", help="ring part's slices")
    p.add_argument("--impls", default="auto,xla", help="ring part's implementations")
    p.add_argument("--head-dims", default="64,128,256", help="ring part's head dims")
    p.add_argument("--plan", default=",".join(DEFAULT_PLAN), help="preset@slice[@uspN] runs")
    p.add_argument(
        "--seqs",
        default=DEFAULT_SEQS,
        help="training-step tokens, ascending; a run stops at the first that does not fit",
    )
    p.add_argument("--out", default=os.path.join(RESULTS, "tpu_compile"))
    return p.parse_args(argv)


def slice_devices(name: str):
    devices = topologies.get_topology_desc(topology_name=name, platform="tpu").devices
    chips = math.prod(int(d) for d in name.split(":")[1].split("x"))
    gen = name.split(":")[0]
    return devices, HBM_PER_CHIP[gen] * chips / len(devices)  # HBM per device (v4: per core)


def _block_sizes(impl: str, device_kind: str) -> str:
    if impl != "pallas_tpu":
        return "-"
    from ringattention.kernels.tpu.blocks import BlockSizes

    bs = BlockSizes.for_chip(device_kind)
    return f"{bs.block_q}x{bs.block_kv} fwd, {bs.block_q_bwd}x{bs.block_kv_bwd} bwd"


def ring_row(name: str, impl: str, head_dim: int, segments: bool) -> dict:
    devices, hbm = slice_devices(name)
    n = len(devices)
    mesh = Mesh(np.array(devices), ("sp",))
    H, K, shard = 32, 8, 8192  # GQA 4:1, 8K tokens per device
    resolved = ra.implementations.resolve(impl, mesh).name
    row = {
        "slice": name,
        "impl": resolved,
        "head_dim": head_dim,
        "segments": segments,
        "tokens": n * shard,
        "heads": f"{H}:{K}",
        "blocks": _block_sizes(resolved, devices[0].device_kind),
    }

    def local(q, k, v, seg):
        f = lambda q, k, v: ra.ring_attention(  # noqa: E731
            q,
            k,
            v,
            "sp",
            causal=True,
            layout="zigzag",
            implementation=impl,
            segment_ids=seg if segments else None,
        )
        o, vjp = jax.vjp(f, q, k, v)
        return (o, *vjp(o))

    spec = P(None, "sp")
    fn = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 4, out_specs=(spec,) * 4))
    sd = lambda h: jax.ShapeDtypeStruct((1, n * shard, h, head_dim), jnp.bfloat16)  # noqa: E731
    args = (sd(H), sd(K), sd(K), jax.ShapeDtypeStruct((1, n * shard), jnp.int32))
    t = time.perf_counter()
    try:
        lowered = fn.trace(*args).lower()
        compiled = lowered.compile()
        mem = compiled.memory_analysis()
        row.update(
            compiles=True,
            kernel="tpu_custom_call" in lowered.as_text(),
            temp_gib=mem.temp_size_in_bytes / GIB,
            hbm_gib=hbm,
        )
    except Exception as e:  # noqa: BLE001  recorded in the table
        row.update(compiles=False, error=f"{type(e).__name__}: {str(e)[:300]}")
    row["compile_s"] = round(time.perf_counter() - t, 1)
    return row


def train_row(preset: str, name: str, usp: int, seq: int) -> dict:
    devices, hbm = slice_devices(name)
    n = len(devices)
    mesh = make_mesh(MeshConfig(sp=n // usp, usp=usp), devices)
    config = llama.get_config(
        preset, attention="auto", remat="full", dtype="bfloat16", param_dtype="float32", layout="zigzag"
    )
    tx = optax.adamw(1e-5)

    def step(params, opt_state, batch):
        grads = jax.grad(lambda p: llama.loss_fn(config, p, batch, mesh=mesh)[0])(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    shardings = llama.param_shardings(config, mesh)
    shapes = llama.abstract_params(config)
    params = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
    )
    opt = jax.eval_shape(tx.init, shapes)
    opt_sh = optax.tree_map_params(
        tx, lambda _, sh: sh, opt, shardings, transform_non_params=lambda _: NamedSharding(mesh, P())
    )
    opt = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), opt, opt_sh)
    tok = NamedSharding(mesh, P(("dp", "fsdp"), ("sp", "usp")))
    batch = {k: jax.ShapeDtypeStruct((1, seq), jnp.int32, sharding=tok) for k in ("input_ids", "targets")}
    row = {"preset": preset, "slice": name, "devices": n, "usp": usp, "seq": seq, "hbm_gib": hbm}
    t = time.perf_counter()
    try:
        lowered = jax.jit(step, donate_argnums=(0, 1)).trace(params, opt, batch).lower()
        compiled = lowered.compile()
        m = compiled.memory_analysis()
        peak = (
            m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
        )
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        row.update(
            compiles=True,
            peak_gib=peak / GIB,
            fits=peak / GIB <= hbm,
            kernel="tpu_custom_call" in lowered.as_text(),
            compiler_tflop=float(cost.get("flops", 0.0)) / 1e12,
            model_tflop_per_device=llama.flops_per_token(config, seq) * seq / n / 1e12,
        )
    except Exception as e:  # noqa: BLE001  recorded in the table
        row.update(compiles=False, fits=False, error=f"{type(e).__name__}: {str(e)[:300]}")
    row["compile_s"] = round(time.perf_counter() - t, 1)
    return row


def run_train(args, rows: list, save) -> list[dict]:
    for entry in args.plan.split(","):
        preset, name, *rest = entry.split("@")
        usp = int(rest[0].removeprefix("usp")) if rest else 1
        for seq in (int(s) for s in args.seqs.split(",")):
            row = train_row(preset, name, usp, seq)
            rows.append(row)
            save()
            if not row["fits"]:
                break
    return rows


def run_ring(args, rows: list, save) -> list[dict]:
    for name in args.slices.split(","):
        for impl in args.impls.split(","):
            for head_dim in (int(d) for d in args.head_dims.split(",")):
                for segments in (False, True):
                    row = ring_row(name, impl, head_dim, segments)
                    rows.append(row)
                    save()
    return rows


def markdown(meta: dict, ring_rows: list[dict], train_rows: list[dict]) -> str:
    lines = [
        f"# Compiled for TPU slices on a CPU host ({meta['date']}, commit {meta['commit']}, "
        f"jax {meta['jax']}, libtpu {meta['libtpu']})",
        "",
        "`python benchmarks/tpu_compile.py`: the TPU compiler's own numbers, no TPU attached. "
        "Memory is per device (a v4 device is one TensorCore: half a chip's 32 GiB). Model "
        "TFLOP: the step's exact FLOPs (`models/flops.py`: 6 N per token plus causal "
        "attention) per device. Compiler TFLOP: XLA's `cost_analysis()`, which counts "
        "neither the Pallas kernels (custom calls) nor more than one trip of the layer scan, "
        "so it is far below the work done.",
        "",
    ]
    if ring_rows:
        lines += [
            "## Ring attention, forward + gradients (32:8 heads, 8K tokens per device, causal zigzag, bf16)",
            "",
            "| slice | implementation | head dim | segments | compiles | blocks (q x kv) "
            "| temp GiB/device | compile s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in ring_rows:
            ok = "yes" if r["compiles"] else f"no: {r['error'][:80]}"
            temp = f"{r['temp_gib']:.2f}" if r["compiles"] else "-"
            lines.append(
                f"| {r['slice']} | {r['impl']} | {r['head_dim']} | "
                f"{'yes' if r['segments'] else 'no'} | {ok} | {r['blocks']} | {temp} | "
                f"{r['compile_s']} |"
            )
        lines.append("")
    if train_rows:
        lines += [
            "## Training step (AdamW, remat full, bf16 compute, f32 weights, attention auto)",
            "",
            "| preset | slice | devices | sp x usp | tokens | peak GiB/device | HBM GiB | "
            "fits | compiler TFLOP | model TFLOP/device | compile s |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in train_rows:
            sp = r["devices"] // r["usp"]
            if r["compiles"]:
                cells = (
                    f"{r['peak_gib']:.1f} | {r['hbm_gib']:.0f} | "
                    f"{'yes' if r['fits'] else 'no'} | {r['compiler_tflop']:.0f} | "
                    f"{r['model_tflop_per_device']:.0f}"
                )
            else:
                cells = f"- | {r['hbm_gib']:.0f} | no: {r['error'][:80]} | - | -"
            lines.append(
                f"| {r['preset']} | {r['slice']} | {r['devices']} | {sp} x {r['usp']} | "
                f"{r['seq'] // 1024}K | {cells} | {r['compile_s']} |"
            )
        lines += ["", "Longest context that fits, per preset and slice:", ""]
        for key in dict.fromkeys((r["preset"], r["slice"], r["usp"]) for r in train_rows):
            fit = [r["seq"] for r in train_rows if (r["preset"], r["slice"], r["usp"]) == key and r["fits"]]
            where = f"{key[1]}" + (f" (usp {key[2]})" if key[2] > 1 else "")
            lines.append(
                f"- {key[0]} on {where}: " + (f"{max(fit) // 1024}K tokens" if fit else "none of those tried")
            )
    return "\n".join(lines) + "\n"


def _meta() -> dict:
    import datetime
    import importlib.metadata

    from benchmarks.work_counts import git_commit  # the repo root is on sys.path (above)

    commit = git_commit()
    try:
        libtpu = importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        libtpu = "unknown"
    return {
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "jax": jax.__version__,
        "libtpu": libtpu,
    }


def main(argv=None):
    """Runs the parts; rewrites the JSON and table after every row, so a stopped run keeps its rows."""
    args = parse_args(argv)
    meta, ring_rows, train_rows = _meta(), [], []

    def save():
        print(json.dumps((ring_rows + train_rows)[-1]), flush=True)
        with open(args.out + ".json", "w") as f:
            json.dump({**meta, "args": vars(args), "ring": ring_rows, "train": train_rows}, f, indent=1)
        with open(args.out + ".md", "w") as f:
            f.write(markdown(meta, ring_rows, train_rows))

    if args.part in ("ring", "both"):
        run_ring(args, ring_rows, save)
    if args.part in ("train", "both"):
        run_train(args, train_rows, save)
    print(markdown(meta, ring_rows, train_rows))


if __name__ == "__main__":
    main()
