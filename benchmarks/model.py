"""Training throughput of the LLaMA model with ring attention on a ring of N devices (one process).

Measures forward+backward tokens/s per device and MFU (model FLOPs from
``models.llama.flops_per_token``: 6N plus causal attention, one document per row, over step seconds x
devices x the datasheet dense bf16 peak, ``models.flops.peak_tflops``: 989 TFLOP/s per H100 or H200)
of a preset at several context lengths, then the longest context whose full training step (forward,
backward, AdamW update) runs on the ring. With ``--sp N`` the sequence is sharded over a mesh
``sp=N`` (weights and optimizer state sharded over the ring too; zigzag layout by default). Ring
Attention with Blockwise Transformers (Liu, Zaharia & Abbeel 2023).

    python benchmarks/model.py                       # 1B at 8K/32K/128K, then 256K..4M, one device
    python benchmarks/model.py --sp 2 --seqs 65536,131072,262144 --fit-seqs 2097152
    python benchmarks/model.py --tiny [--sp 2]       # CPU smoke test with the debug preset

Every record states ``devices`` and ``seq``; executed steps state ``step_seconds`` (timed rows: the
median) and the devices' runtime ``process_peak_bytes_in_use`` where the backend reports it. Writes JSON
to ``--out`` (default benchmarks/results/model_<preset>_<backend>.json) after every record.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from models import flops as flops_lib  # noqa: E402
from models import llama  # noqa: E402
from models.sharding import BATCH, MeshConfig, make_mesh  # noqa: E402
from ringattention import implementations, layouts, remat  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="1b")
    p.add_argument("--sp", type=int, default=1, help="ring size: devices on the mesh's sp axis")
    p.add_argument("--layout", default=None, help="ring layout (default: zigzag when --sp > 1)")
    p.add_argument("--seqs", default="8192,32768,131072", help="contexts to time (comma list)")
    p.add_argument(
        "--fit-seqs",
        default="262144,524288,1048576,2097152,4194304",
        help="contexts tried in order for the longest full training step",
    )
    p.add_argument(
        "--fit-mlp-chunk",
        type=int,
        default=16384,
        help="mlp_chunk for the longest-context search when the preset has none",
    )
    p.add_argument(
        "--fit-remat",
        default=None,
        help="remat policy of the longest-context search (default: --remat, else the preset's)",
    )
    p.add_argument(
        "--fit-compile-only",
        action="store_true",
        help="for the longest-context search, only compile each step and report XLA's "
        "memory analysis (peak bytes against the device's memory), running nothing",
    )
    p.add_argument("--remat", default=None, help="override the preset's remat policy")
    p.add_argument("--mlp-chunk", type=int, default=None)
    p.add_argument("--loss-chunk", type=int, default=None)
    p.add_argument("--attention", default="auto")
    p.add_argument("--q-chunk", type=int, default=None)
    p.add_argument("--kv-chunk", type=int, default=None)
    p.add_argument(
        "--hopper-backward",
        default=None,
        choices=("triton", "mosaic", "fused"),
        help="pallas_hopper's backward kernels (overrides its default block sizes)",
    )
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=0.0,
        help="per-device peak the MFU divides by; 0: the device's datasheet dense bf16 "
        "peak, models.flops.peak_tflops (H100 and H200: 989 TFLOP/s)",
    )
    p.add_argument("--tiny", action="store_true", help="debug preset, tiny contexts (CPU test)")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def make_config(args) -> llama.LlamaConfig:
    over = {"attention": args.attention}
    for field, value in (
        ("remat", args.remat),
        ("mlp_chunk", args.mlp_chunk),
        ("loss_chunk", args.loss_chunk),
        ("q_chunk", args.q_chunk),
        ("kv_chunk", args.kv_chunk),
        ("layout", args.layout),
    ):
        if value is not None:
            over[field] = value
    if args.sp > 1 and args.layout is None:
        over["layout"] = "zigzag"  # balanced causal work over the ring
    if args.tiny:
        tiny = dict(remat="full", mlp_chunk=16, loss_chunk=16, q_chunk=16, kv_chunk=16)
        return llama.get_config("debug", **(tiny | over))
    return llama.get_config(args.preset, **over)


def make_mesh_for(args):
    """None for a ring of one (the model's mesh-free path), else a mesh sp=N of the first N devices."""
    if args.sp == 1:
        return None
    if args.sp > jax.device_count():
        raise ValueError(f"--sp={args.sp} but only {jax.device_count()} devices are visible")
    return make_mesh(MeshConfig(sp=args.sp), jax.devices()[: args.sp])


def make_batch(config, seq: int, mesh=None):
    """One row of random tokens (one document), in the ring layout, sharded over sp."""
    n = 1 if mesh is None else mesh.shape["sp"]
    rng = np.random.default_rng(seq)
    ids = rng.integers(0, config.vocab_size, (1, seq + 1), dtype=np.int32)
    natural = {
        "input_ids": ids[:, :-1],
        "targets": ids[:, 1:],
        "positions": np.arange(seq, dtype=np.int32)[None],
        "loss_mask": np.ones((1, seq), np.float32),
    }
    batch = {k: np.asarray(layouts.to_layout(v, config.layout, n)) for k, v in natural.items()}
    if mesh is None:
        return jax.tree.map(jnp.asarray, batch)
    return jax.device_put(batch, NamedSharding(mesh, P(BATCH, "sp")))


def batch_shapes(config, seq: int, mesh=None):
    sharding = None if mesh is None else NamedSharding(mesh, P(BATCH, "sp"))
    shape = lambda dt: jax.ShapeDtypeStruct((1, seq), dt, sharding=sharding)  # noqa: E731
    return {
        "input_ids": shape(jnp.int32),
        "targets": shape(jnp.int32),
        "positions": shape(jnp.int32),
        "loss_mask": shape(jnp.float32),
    }


def timed(fn, args, steps: int, warmup: int) -> float:
    """Median seconds of ``fn(*args)`` (outputs blocked on)."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def rates(config, seq: int, seconds: float, devices: int, peak: float) -> dict:
    """Per-device tokens/s, TFLOP/s and MFU of one step of ``seq`` tokens over ``devices``."""
    flops = llama.flops_per_token(config, seq) * seq
    return {
        "step_seconds": seconds,
        "tokens_per_s": seq / seconds,
        "tokens_per_s_per_device": seq / seconds / devices,
        "tflops_per_s_per_device": flops / seconds / devices / 1e12,
        "mfu": flops / seconds / (devices * peak * 1e12),
        "model_flops": flops,
    }


def throughput(config, params, seq: int, args, mesh) -> dict:
    """Forward+backward (``jax.grad`` of the loss) at context ``seq``, batch 1."""
    batch = make_batch(config, seq, mesh)
    grad = jax.jit(jax.grad(lambda p, b: llama.loss_fn(config, p, b, mesh=mesh)[0]))
    compiled = grad.lower(params, batch).compile()
    seconds = timed(compiled, (params, batch), args.steps, args.warmup)
    return {
        "seq": seq,
        "devices": args.sp,
        "remat": config.remat,
        **rates(config, seq, seconds, args.sp, args.peak_tflops),
        **memory(compiled),
        **runtime_peak(mesh),
    }


def memory(compiled) -> dict:
    """XLA's memory analysis of a compiled step (per device for a sharded step)."""
    stats = compiled.memory_analysis()
    if stats is None:
        return {}
    keys = (
        "argument_size_in_bytes",
        "output_size_in_bytes",
        "temp_size_in_bytes",
        "alias_size_in_bytes",
        "peak_memory_in_bytes",
        "host_temp_size_in_bytes",
    )
    return {k: int(getattr(stats, k)) for k in keys if hasattr(stats, k)}


def _devices(mesh):
    return jax.devices()[:1] if mesh is None else list(mesh.devices.flat)


def runtime_peak(mesh) -> dict:
    """The allocator's ``peak_bytes_in_use`` since the process started, the largest over the ring's
    devices: it covers this record and every earlier one of the process (run a long context alone,
    e.g. ``--seqs "" --fit-seqs 1048576``, to read its own peak)."""
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in _devices(mesh)]
    peaks = [int(p) for p in peaks if p is not None]
    return {"process_peak_bytes_in_use": max(peaks)} if peaks else {}


def resolved_attention(config) -> str:
    """The ring-step implementation that config.attention runs on this backend ("auto" resolved)."""
    if config.attention in ("reference", "cudnn"):
        return config.attention
    return implementations.resolve(config.attention).name


def device_bytes() -> dict:
    """The device's memory limit for XLA allocations (bytes_limit), when the backend reports it."""
    stats = jax.devices()[0].memory_stats() or {}
    return {"device_bytes_limit": int(stats["bytes_limit"])} if "bytes_limit" in stats else {}


def train_step_fn(config, tx, mesh):
    def step(params, opt_state, batch):
        (loss, _), grads = jax.value_and_grad(
            lambda p: llama.loss_fn(config, p, batch, mesh=mesh), has_aux=True
        )(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))


def abstract_state(config, tx, mesh):
    """ShapeDtypeStructs (sharded over the mesh when there is one) of params and AdamW state."""
    params = llama.abstract_params(config)
    if mesh is not None:
        shardings = llama.param_shardings(config, mesh)
        params = jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), params, shardings
        )
    opt_state = jax.eval_shape(tx.init, params)
    if mesh is not None:  # moments like their parameter, scalars replicated
        out = jax.jit(tx.init).lower(params).compile().output_shardings
        opt_state = jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), opt_state, out
        )
    return params, opt_state


def compile_only_row(compiled, seq: int, args) -> dict:
    row = {"seq": seq, "devices": args.sp, "compiled_only": True, **memory(compiled), **device_bytes()}
    limit = row.get("device_bytes_limit")
    row["needed_bytes"] = max(
        row.get("peak_memory_in_bytes", 0),
        sum(row.get(k + "_size_in_bytes", 0) for k in ("argument", "temp", "output"))
        - row.get("alias_size_in_bytes", 0),
    )  # conservative: all live at once
    row["fits"] = None if limit is None else row["needed_bytes"] <= limit
    return row


def fit_config(config, args) -> llama.LlamaConfig:
    over = {}
    if config.mlp_chunk is None and args.fit_mlp_chunk:
        over["mlp_chunk"] = args.fit_mlp_chunk
    if args.fit_remat:
        over["remat"] = args.fit_remat
    return dataclasses.replace(config, **over)


def longest_fit(config, args, mesh, record) -> dict:
    """Tries contexts in order; the largest whose full training step runs, and the first failure.

    ``record(row)`` is called after every context (results survive a run that is stopped later).
    """
    config = fit_config(config, args)
    tx = optax.adamw(1e-5)
    step = train_step_fn(config, tx, mesh)
    best, failure = None, None
    for seq in [int(s) for s in args.fit_seqs.split(",") if s]:
        try:
            if args.fit_compile_only:  # shapes only: nothing is allocated or run
                compiled = step.lower(
                    *abstract_state(config, tx, mesh), batch_shapes(config, seq, mesh)
                ).compile()
                row = compile_only_row(compiled, seq, args)
                print(f"compiles: {row}", flush=True)
                best = row if row["fits"] is not False else best
                record(row)
                continue
            params = llama.init_params(config, jax.random.key(0), mesh)
            opt_state = jax.jit(tx.init)(params)
            batch = make_batch(config, seq, mesh)
            compiled = step.lower(params, opt_state, batch).compile()
            t = time.perf_counter()
            params, opt_state, loss = compiled(params, opt_state, batch)
            loss = float(loss)
            seconds = time.perf_counter() - t
            if not np.isfinite(loss):
                raise FloatingPointError(f"loss={loss}")
            best = {
                "seq": seq,
                "devices": args.sp,
                "remat": config.remat,
                "loss": loss,
                "train_step": "fwd+bwd+AdamW",
                **rates(config, seq, seconds, args.sp, args.peak_tflops),
                **memory(compiled),
                **runtime_peak(mesh),
            }
            print(f"fits: {best}", flush=True)
            record(best)
        except Exception as e:  # noqa: BLE001 - out-of-memory surfaces as several error types
            failure = {"seq": seq, "devices": args.sp, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"does not fit: {failure}", flush=True)
            record(failure)
            break
        finally:
            params = opt_state = batch = None
    return {"mlp_chunk": config.mlp_chunk, "remat": config.remat, "longest": best, "first_failure": failure}


def _use_hopper_backward(name: str) -> None:
    """Every default ``pallas_hopper`` block size (the step's and the deterministic hook's) runs the
    backward ``name``."""
    from ringattention.kernels.hopper import block_sizes, pallas_hopper

    default = block_sizes.default_block_sizes

    def patched(*args, **kwargs):
        return dataclasses.replace(default(*args, **kwargs), backward=name)

    pallas_hopper.default_block_sizes = block_sizes.default_block_sizes = patched


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.tiny:  # tiny defaults unless given
        defaults = parse_args([])
        if args.seqs == defaults.seqs:
            args.seqs = "64,128"
        if args.fit_seqs == defaults.fit_seqs:
            args.fit_seqs = "256,512"
        args.steps, args.warmup = 1, 1
    config = make_config(args)
    if "offload_attn" in (config.remat, args.fit_remat):
        remat.allow_host_offload()  # before the first computation creates the GPU client
    mesh = make_mesh_for(args)
    if args.hopper_backward:
        _use_hopper_backward(args.hopper_backward)
    device = jax.devices()[0]
    args.peak_tflops, peak_source = flops_lib.peak_tflops(device.device_kind, args.peak_tflops)
    result = {
        "preset": "debug" if args.tiny else args.preset,
        "config": dataclasses.asdict(config),
        "devices": args.sp,
        "device": device.device_kind,
        "backend": jax.default_backend(),
        "jax": jax.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "peak_tflops": args.peak_tflops,
        "peak_source": peak_source,
        "mfu_definition": "model FLOPs (6N + causal attention, one document per row) / step "
        "seconds / (devices x peak_tflops, the datasheet dense bf16 peak)",
        "command": " ".join(sys.argv[1:] if argv is None else argv),
        "num_params": llama.num_params(config),
        "throughput": [],
        "fit_rows": [],
        "attention_resolved": resolved_attention(config),
        "hopper_backward": args.hopper_backward,
    }
    suffix = "" if args.sp == 1 else f"_sp{args.sp}"
    out = args.out or os.path.join(RESULTS, f"model_{result['preset']}_{result['backend']}{suffix}.json")

    def save():
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(result, f, indent=2, default=str)

    params = llama.init_params(config, jax.random.key(0), mesh)
    for seq in [int(s) for s in args.seqs.split(",") if s]:
        row = throughput(config, params, seq, args, mesh)
        print(json.dumps(row), flush=True)
        result["throughput"].append(row)
        save()
    params = None
    result["fit"] = longest_fit(config, args, mesh, lambda row: (result["fit_rows"].append(row), save()))
    save()
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
