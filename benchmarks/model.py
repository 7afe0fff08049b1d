"""One-GPU training throughput of the LLaMA model with ring attention (ring of one device).

Measures forward+backward tokens/s and MFU (model FLOPs from ``models.llama.flops_per_token``: 6N plus
causal attention, against a measured bf16 matmul peak, 790 TFLOP/s on an H200) of a preset at several
context lengths, then the longest context whose full training step (forward, backward, AdamW update)
fits on the device. Ring Attention with Blockwise Transformers (Liu, Zaharia & Abbeel 2023).

    python benchmarks/model.py                       # 1B at 8K/32K/128K, then 256K..4M
    python benchmarks/model.py --tiny                # CPU smoke test with the debug preset

Writes JSON to benchmarks/results/model_<preset>_<backend>.json.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from models import flops as flops_lib  # noqa: E402
from models import llama  # noqa: E402
from ringattention import implementations  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="1b")
    p.add_argument("--seqs", default="8192,32768,131072", help="contexts to time (comma list)")
    p.add_argument("--fit-seqs", default="262144,524288,1048576,2097152,4194304",
                   help="contexts tried in order for the longest full training step")
    p.add_argument("--fit-mlp-chunk", type=int, default=16384,
                   help="mlp_chunk for the longest-context search when the preset has none")
    p.add_argument("--fit-compile-only", action="store_true",
                   help="for the longest-context search, only compile each step and report XLA's "
                        "memory analysis (peak bytes against the device's memory), running nothing")
    p.add_argument("--remat", default=None, help="override the preset's remat policy")
    p.add_argument("--mlp-chunk", type=int, default=None)
    p.add_argument("--loss-chunk", type=int, default=None)
    p.add_argument("--attention", default="auto")
    p.add_argument("--q-chunk", type=int, default=None)
    p.add_argument("--kv-chunk", type=int, default=None)
    p.add_argument("--hopper-backward", default=None, choices=("triton", "mosaic"),
                   help="pallas_hopper's backward kernels (overrides its default block sizes)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--peak-tflops", type=float, default=0.0,
                   help="0: models.flops.peak_tflops of the device (H200: the measured 790)")
    p.add_argument("--tiny", action="store_true", help="debug preset, tiny contexts (CPU test)")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def make_config(args) -> llama.LlamaConfig:
    over = {"attention": args.attention}
    for field, value in (("remat", args.remat), ("mlp_chunk", args.mlp_chunk),
                         ("loss_chunk", args.loss_chunk), ("q_chunk", args.q_chunk),
                         ("kv_chunk", args.kv_chunk)):
        if value is not None:
            over[field] = value
    if args.tiny:
        return llama.get_config("debug", remat="full", mlp_chunk=16, loss_chunk=16, q_chunk=16,
                                kv_chunk=16, **over)
    return llama.get_config(args.preset, **over)


def make_batch(config, seq: int):
    rng = np.random.default_rng(seq)
    ids = jnp.asarray(rng.integers(0, config.vocab_size, (1, seq + 1), dtype=np.int32))
    return {"input_ids": ids[:, :-1], "targets": ids[:, 1:],
            "positions": jnp.arange(seq, dtype=jnp.int32)[None],
            "loss_mask": jnp.ones((1, seq), jnp.float32)}


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


def throughput(config, params, seq: int, args) -> dict:
    """Forward+backward tokens/s and MFU at context ``seq`` (batch 1)."""
    batch = make_batch(config, seq)
    grad = jax.jit(jax.grad(lambda p, b: llama.loss_fn(config, p, b)[0]))
    compiled = grad.lower(params, batch).compile()
    seconds = timed(compiled, (params, batch), args.steps, args.warmup)
    flops = llama.flops_per_token(config, seq) * seq
    return {"seq": seq, "seconds": seconds, "tokens_per_s": seq / seconds,
            "tflops_per_s": flops / seconds / 1e12,
            "mfu": flops / seconds / (args.peak_tflops * 1e12), **memory(compiled)}


def memory(compiled) -> dict:
    stats = compiled.memory_analysis()
    if stats is None:
        return {}
    keys = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
            "alias_size_in_bytes", "peak_memory_in_bytes")
    return {k: int(getattr(stats, k)) for k in keys if hasattr(stats, k)}


def resolved_attention(config) -> str:
    """The ring-step implementation that config.attention runs on this backend ("auto" resolved)."""
    if config.attention in ("reference", "cudnn"):
        return config.attention
    return implementations.resolve(config.attention).name


def device_bytes() -> dict:
    """The device's memory limit for XLA allocations (bytes_limit), when the backend reports it."""
    stats = jax.devices()[0].memory_stats() or {}
    return {"device_bytes_limit": int(stats["bytes_limit"])} if "bytes_limit" in stats else {}


def train_step_fn(config, tx):
    def step(params, opt_state, batch):
        (loss, _), grads = jax.value_and_grad(
            lambda p: llama.loss_fn(config, p, batch), has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))


def longest_fit(config, args) -> dict:
    """Tries contexts in order; the largest whose full training step runs, and the first failure."""
    if config.mlp_chunk is None and args.fit_mlp_chunk:
        config = dataclasses.replace(config, mlp_chunk=args.fit_mlp_chunk)
    tx = optax.adamw(1e-5)
    step = train_step_fn(config, tx)
    best, failure = None, None
    for seq in [int(s) for s in args.fit_seqs.split(",") if s]:
        try:
            if args.fit_compile_only:  # shapes only: nothing is allocated or run
                params = llama.abstract_params(config)
                opt_state = jax.eval_shape(tx.init, params)
                batch = jax.eval_shape(lambda: make_batch(config, seq))
            else:
                params = llama.init_params(config, jax.random.key(0))
                opt_state = tx.init(params)
                batch = make_batch(config, seq)
            compiled = step.lower(params, opt_state, batch).compile()
            if args.fit_compile_only:
                row = {"seq": seq, "compiled_only": True, **memory(compiled), **device_bytes()}
                limit = row.get("device_bytes_limit")
                row["needed_bytes"] = max(row.get("peak_memory_in_bytes", 0), sum(
                    row.get(k + "_size_in_bytes", 0) for k in ("argument", "temp", "output")
                ) - row.get("alias_size_in_bytes", 0))  # conservative: all live at once
                row["fits"] = None if limit is None else row["needed_bytes"] <= limit
                print(f"compiles: {row}", flush=True)
                best = row if row["fits"] is not False else best
                continue
            t = time.perf_counter()
            params, opt_state, loss = compiled(params, opt_state, batch)
            loss = float(loss)
            seconds = time.perf_counter() - t
            if not np.isfinite(loss):
                raise FloatingPointError(f"loss={loss}")
            best = {"seq": seq, "step_seconds": seconds, "loss": loss, **memory(compiled)}
            print(f"fits: {best}", flush=True)
        except Exception as e:  # noqa: BLE001 - out-of-memory surfaces as several error types
            failure = {"seq": seq, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"does not fit: {failure}", flush=True)
            break
        finally:
            params = opt_state = batch = None
    return {"mlp_chunk": config.mlp_chunk, "longest": best, "first_failure": failure}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.tiny:
        args.seqs, args.fit_seqs = "64,128", "256,512"
        args.steps, args.warmup = 1, 1
    config = make_config(args)
    if args.hopper_backward:
        from ringattention.kernels import pallas_hopper

        default = pallas_hopper.default_block_sizes
        pallas_hopper.default_block_sizes = lambda d: dataclasses.replace(
            default(d), backward=args.hopper_backward)
    device = jax.devices()[0]
    args.peak_tflops, peak_source = flops_lib.peak_tflops(device.device_kind, args.peak_tflops)
    result = {"preset": "debug" if args.tiny else args.preset, "config": dataclasses.asdict(config),
              "device": device.device_kind, "backend": jax.default_backend(),
              "jax": jax.__version__, "peak_tflops": args.peak_tflops,
              "peak_source": peak_source,
              "num_params": llama.num_params(config), "throughput": [],
              "attention_resolved": resolved_attention(config),
              "hopper_backward": args.hopper_backward}
    params = llama.init_params(config, jax.random.key(0))
    for seq in [int(s) for s in args.seqs.split(",") if s]:
        row = throughput(config, params, seq, args)
        print(json.dumps(row), flush=True)
        result["throughput"].append(row)
    params = None
    result["fit"] = longest_fit(config, args)
    out = args.out or os.path.join(RESULTS, f"model_{result['preset']}_{result['backend']}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2, default=str)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
