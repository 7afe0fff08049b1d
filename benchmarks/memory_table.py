"""Per-device memory of a full training step on rings of 4..32 devices, by compilation only.

Compiles (never runs) the AdamW training step of a preset with the sequence sharded over a ring of N
virtual CPU devices (mesh sp=N, weights and optimizer state sharded over sp, Ring Attention, Liu et
al. 2023) and reads XLA's ``compiled.memory_analysis()``: arguments (parameters, optimizer state,
batch), outputs, temporaries, donated aliases. Per-device peak = arguments + outputs + temporaries -
aliases. CPU buffer assignment approximates the GPU one (the CPU compiler may widen bf16 matmuls to
float32, so the numbers lean high); the "xla" ring step is used.

    python benchmarks/memory_table.py                           # 8B and 70B, 128K..1M, rings 4..32
    python benchmarks/memory_table.py --presets debug --seqs 256,512 --rings 2,4   # CPU smoke test

Writes benchmarks/results/memory_table.json and memory_table.md.
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="8b,70b")
    p.add_argument("--seqs", default="131072,262144,524288,1048576")
    p.add_argument("--rings", default="4,8,16,32")
    p.add_argument("--remat", default="full")
    p.add_argument("--mlp-chunk", type=int, default=8192)
    p.add_argument("--loss-chunk", type=int, default=2048)
    p.add_argument("--chunk", type=int, default=2048, help="ring inner-loop q/kv block size")
    p.add_argument("--out", default=None, help="output prefix (default benchmarks/results/...)")
    p.add_argument("--from-json", default=None, help="only re-render the markdown of a saved run")
    p.add_argument(
        "--no-cpu-licm",
        action="store_true",
        help="disable XLA's while-loop-invariant code motion: on CPU it hoists a float32 "
        "copy of the whole stack of saved layer inputs out of the backward scan "
        "(2x the bfloat16 stack), which the GPU compiler does not do",
    )
    return p.parse_args(argv)


ARGS = parse_args()
_MAX_RING = max(int(r) for r in ARGS.rings.split(","))
_LICM = " --xla_disable_hlo_passes=while-loop-invariant-code-motion" if ARGS.no_cpu_licm else ""
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_MAX_RING}{_LICM}"
).strip()
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import json  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from models import llama  # noqa: E402
from models.sharding import MeshConfig, make_mesh  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
GIB = 2**30


def abstract_state(config, mesh, tx):
    """ShapeDtypeStructs with shardings for params and the AdamW state."""
    shardings = llama.param_shardings(config, mesh)
    shapes = llama.abstract_params(config)
    params = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
    )
    opt = jax.eval_shape(tx.init, shapes)
    replicated = NamedSharding(mesh, P())
    opt_shardings = optax.tree_map_params(
        tx, lambda _, sh: sh, opt, shardings, transform_non_params=lambda _: replicated
    )
    opt = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), opt, opt_shardings)
    return params, opt


def compile_step(config, mesh, seq: int):
    tx = optax.adamw(1e-5)

    def step(params, opt_state, batch):
        (loss, _), grads = jax.value_and_grad(
            lambda p: llama.loss_fn(config, p, batch, mesh=mesh), has_aux=True
        )(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params, opt = abstract_state(config, mesh, tx)
    tok = NamedSharding(mesh, P(("dp", "fsdp"), "sp"))
    batch = {
        k: jax.ShapeDtypeStruct((1, seq), jnp.int32, sharding=tok)
        for k in ("input_ids", "targets", "positions")
    }
    batch["loss_mask"] = jax.ShapeDtypeStruct((1, seq), jnp.float32, sharding=tok)
    return jax.jit(step, donate_argnums=(0, 1)).lower(params, opt, batch).compile()


def measure(preset: str, seq: int, ring: int, args) -> dict:
    config = llama.get_config(
        preset,
        attention="xla",
        remat=args.remat,
        mlp_chunk=args.mlp_chunk,
        loss_chunk=args.loss_chunk,
        q_chunk=args.chunk,
        kv_chunk=args.chunk,
    )
    mesh = make_mesh(MeshConfig(sp=ring), jax.devices()[:ring])
    t = time.perf_counter()
    stats = compile_step(config, mesh, seq).memory_analysis()
    row = {"preset": preset, "seq": seq, "ring": ring, "compile_s": time.perf_counter() - t}
    for k in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes", "alias_size_in_bytes"):
        row[k] = int(getattr(stats, k))
    row["peak_bytes"] = (
        row["argument_size_in_bytes"]
        + row["output_size_in_bytes"]
        + row["temp_size_in_bytes"]
        - row["alias_size_in_bytes"]
    )
    return row


def markdown(rows, args) -> str:
    rings = sorted({r["ring"] for r in rows})
    lines = [
        f"Per-device peak of one training step (GiB): remat={args.remat}, "
        f"mlp_chunk={args.mlp_chunk}, loss_chunk={args.loss_chunk}, ring block {args.chunk}, "
        "params float32, compute bfloat16, AdamW; compile-only on CPU (jax "
        f"{jax.__version__}). Peak = arguments + outputs + temporaries - donated aliases. The "
        "CPU compiler also keeps float32 copies of bfloat16 activations (float normalization; "
        "e.g. the per-layer saved inputs), so these numbers lean high against a GPU."
        + (
            " Run with --no-cpu-licm: the float32 copy of the saved-input stack that CPU "
            "loop-invariant code motion hoists is gone; the CPU still computes bfloat16 matmuls "
            "in float32, so per-layer working buffers stay twice the GPU's."
            if getattr(args, "no_cpu_licm", False)
            else ""
        ),
        "",
        "| preset | tokens | " + " | ".join(f"ring {n}" for n in rings) + " |",
        "|---|---|" + "---|" * len(rings),
    ]
    keys = list(dict.fromkeys((r["preset"], r["seq"]) for r in rows))  # in run order
    for preset, seq in keys:
        cells = []
        for n in rings:
            hit = [r for r in rows if (r["preset"], r["seq"], r["ring"]) == (preset, seq, n)]
            cells.append(f"{hit[0]['peak_bytes'] / GIB:.1f}" if hit and "peak_bytes" in hit[0] else "n/a")
        lines.append(f"| {preset} | {seq // 1024}K | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(args=ARGS):
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        prefix = args.out or os.path.splitext(args.from_json)[0]
        run_args = argparse.Namespace(**saved["args"])
        with open(prefix + ".md", "w") as f:
            f.write(markdown(saved["rows"], run_args))
        return
    rows = []
    for preset in args.presets.split(","):
        for seq in [int(s) for s in args.seqs.split(",")]:
            for ring in [int(r) for r in args.rings.split(",")]:
                try:
                    row = measure(preset, seq, ring, args)
                except Exception as e:  # noqa: BLE001 - recorded in the table as n/a
                    row = {
                        "preset": preset,
                        "seq": seq,
                        "ring": ring,
                        "error": f"{type(e).__name__}: {str(e)[:300]}",
                    }
                print(json.dumps(row), flush=True)
                rows.append(row)
    prefix = args.out or os.path.join(RESULTS, "memory_table")
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    with open(prefix + ".json", "w") as f:
        json.dump({"args": vars(args), "jax": jax.__version__, "rows": rows}, f, indent=2)
    with open(prefix + ".md", "w") as f:
        f.write(markdown(rows, args))
    print(markdown(rows, args))


if __name__ == "__main__":
    main()
