"""Long-context inference: ring-attention prefill and sharded-KV-cache decode against context length.

For each context length: prefill tokens/s (ring attention over "sp"; one device = a ring of one),
decode tokens/s with the cache kept in place and per-device partials merged by one all-reduce
(``models.kvcache.cache_attention``), and the same decode with the Large World Model scheme (Liu
et al. 2024) of rotating the cache around the ring for every token
(``models.kvcache.rotating_cache_attention``; on one device the rotation has no hops,
so it costs attending through ring attention's blockwise step over the whole cache), plus KV-cache bytes per
device. Random weights. Ring Attention with Blockwise Transformers (Liu, Zaharia & Abbeel 2023).

    python benchmarks/inference.py --out benchmarks/results/inference_h200      # 1B, 8K..128K
    python benchmarks/inference.py --tiny --out /tmp/inference_cpu              # CPU smoke test

Writes ``<out>.json`` and ``<out>.md``. Contexts double from ``--min-context`` to
``--max-context``; the sweep stops at the first out-of-memory or once ``--time-budget`` seconds
are spent (both are recorded).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from models import decode, kvcache, llama  # noqa: E402
from models import generate as gen  # noqa: E402
from models.kvcache import KVCache  # noqa: E402
from models.sharding import MeshConfig, make_mesh  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="1b")
    p.add_argument("--dtype", default="bfloat16", help="compute and parameter dtype")
    p.add_argument("--attention", default="auto", help="prefill ring-attention implementation")
    p.add_argument("--mlp-chunk", type=int, default=16384, help="prefill MLP chunk (tokens)")
    p.add_argument("--min-context", type=int, default=8192)
    p.add_argument("--max-context", type=int, default=131072)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--decode-steps", type=int, default=32, help="timed decode steps")
    p.add_argument("--baseline-steps", type=int, default=8, help="timed rotating-baseline steps")
    p.add_argument("--sp", type=int, default=1, help="ring size (devices on the sp axis)")
    p.add_argument("--time-budget", type=float, default=200.0, help="seconds; no new context after")
    p.add_argument(
        "--contexts", default=None, help="explicit comma list of contexts (overrides the doubling)"
    )
    p.add_argument(
        "--decode-only-from",
        type=int,
        default=None,
        help="from this context on, skip the prefill and decode from a random-filled cache "
        "(decode cost does not depend on the cached values; prefill is then unmeasured)",
    )
    p.add_argument("--tiny", action="store_true", help="debug preset, contexts 64..256 (CPU test)")
    p.add_argument("--out", required=True, help="output path prefix (.json and .md are added)")
    return p.parse_args(argv)


def _is_oom(e: Exception) -> bool:
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def _time_decode(config, params, cache, logits, steps: int, mesh, mode: str):
    """(seconds per step, cache): greedy tokens stay on the device; one sync at the end."""
    tok = jnp.argmax(logits, -1).astype(jnp.int32)[:, None]
    logits, cache = gen.extend(config, params, cache, tok, mesh=mesh, mode=mode)  # compile
    jax.block_until_ready(logits)
    t0 = time.perf_counter()
    for _ in range(steps):
        tok = jnp.argmax(logits, -1).astype(jnp.int32)[:, None]
        logits, cache = gen.extend(config, params, cache, tok, mesh=mesh, mode=mode)
    jax.block_until_ready(logits)
    return (time.perf_counter() - t0) / steps, cache


def synthetic_cache(config, batch: int, context: int, T: int, mesh):
    """A KVCache of length T holding ``context`` random keys/values (tiled from one random block,
    so that building it needs no temporary as large as the cache), and random last-token logits."""
    n = 1 if mesh is None else mesh.shape["sp"]
    L, K, D = config.num_layers, config.num_kv_heads, config.head_dim
    tile = min(T, 4096)
    while T % tile:
        tile //= 2
    dt = jnp.dtype(config.dtype)

    @jax.jit
    def build(key):
        kk, kv, kl = jax.random.split(key, 3)
        block = lambda k: jax.random.normal(k, (L, batch, tile, K, D), jnp.float32).astype(dt)
        k, v = (jnp.tile(block(x), (1, 1, T // tile, 1, 1)) for x in (kk, kv))  # [L, B, T, K, D]
        sh = kvcache.cache_sharding(mesh)
        if sh is not None:
            k, v = (jax.lax.with_sharding_constraint(a, sh) for a in (k, v))
        logits = jax.random.normal(kl, (batch, config.vocab_size), jnp.float32)
        return logits, k, v

    logits, k, v = build(jax.random.key(context))
    lengths = jnp.full((batch,), context, jnp.int32)
    return logits, KVCache(k, v, lengths, config.layout, n)


def measure(config, params, context: int, args, mesh) -> dict:
    """One context length: prefill, decode (all-reduce) and rotating-baseline decode."""
    n = 1 if mesh is None else mesh.shape["sp"]
    extra = 2 + args.decode_steps + args.baseline_steps
    T = gen.cache_length(context + extra, config.layout, n)
    if args.decode_only_from is not None and context >= args.decode_only_from:
        logits, cache = synthetic_cache(config, args.batch, context, T, mesh)
        row = {
            "context": context,
            "cache_len": T,
            "batch": args.batch,
            "kv_bytes_per_device": cache.nbytes_per_device(),
            "prefill_s": None,
            "prefill_tok_s": None,
            "synthetic_cache": True,
        }
        return _decode_rows(config, params, cache, logits, args, mesh, row)
    rng = np.random.default_rng(context)
    tokens = np.zeros((args.batch, T), np.int32)
    tokens[:, :context] = rng.integers(0, config.vocab_size, (args.batch, context))
    lengths = jnp.full((args.batch,), context, jnp.int32)
    t0 = time.perf_counter()
    compiled = decode._prefill_fn(config, mesh).lower(params, jnp.asarray(tokens), lengths).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    logits, cache = compiled(params, jnp.asarray(tokens), lengths)
    jax.block_until_ready(logits)
    prefill_s = time.perf_counter() - t0
    row = {
        "context": context,
        "cache_len": T,
        "batch": args.batch,
        "kv_bytes_per_device": cache.nbytes_per_device(),
        "prefill_compile_s": compile_s,
        "prefill_s": prefill_s,
        "prefill_tok_s": args.batch * context / prefill_s,
    }
    return _decode_rows(config, params, cache, logits, args, mesh, row)


def _decode_rows(config, params, cache, logits, args, mesh, row: dict) -> dict:
    step_s, cache = _time_decode(config, params, cache, logits, args.decode_steps, mesh, "allreduce")
    row.update(decode_ms=1e3 * step_s, decode_tok_s=args.batch / step_s)
    if args.baseline_steps > 0:
        step_s, cache = _time_decode(config, params, cache, logits, args.baseline_steps, mesh, "rotate")
        row.update(baseline_decode_ms=1e3 * step_s, baseline_decode_tok_s=args.batch / step_s)
        row["decode_speedup"] = row["baseline_decode_ms"] / row["decode_ms"]
    del cache
    return row


def write_md(result: dict, path: str) -> None:
    lines = [
        f"# Long-context inference: {result['preset']} on {result['device']}",
        "",
        f"dtype {result['dtype']}, batch {result['batch']}, sp={result['sp']}, random weights; "
        "decode = cache in place + one all-reduce per layer; baseline = rotate the cache "
        "around the ring per token (ring attention's blockwise step over the whole cache).",
        "",
        "| context | prefill tok/s | decode ms/tok | decode tok/s | baseline ms/tok | "
        "speedup | KV bytes/device |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        base = r.get("baseline_decode_ms")
        base_ms = "-" if base is None else f"{base:.2f}"
        speedup = "-" if base is None else f"{r['decode_speedup']:.2f}x"
        prefill = "not run" if r["prefill_tok_s"] is None else f"{r['prefill_tok_s']:,.0f}"
        lines.append(
            f"| {r['context']} | {prefill} | {r['decode_ms']:.2f} | "
            f"{r['decode_tok_s']:.1f} | {base_ms} | {speedup} | "
            f"{r['kv_bytes_per_device'] / 2**20:,.1f} MiB |"
        )
    if any(r.get("synthetic_cache") for r in result["rows"]):
        lines.append(
            "\n'not run': decode measured from a random-filled cache of that length (decode "
            "cost does not depend on the cached values); the prefill was not run."
        )
    for note in result["notes"]:
        lines.append(f"\n{note}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.tiny:
        args.preset, args.min_context, args.max_context = "debug", 64, 256
        args.decode_steps, args.baseline_steps, args.mlp_chunk = 4, 2, 32
    config = llama.get_config(
        args.preset,
        dtype=args.dtype,
        param_dtype=args.dtype,
        attention=args.attention,
        mlp_chunk=args.mlp_chunk,
    )
    mesh = None
    if args.sp != 1:
        mesh = make_mesh(MeshConfig(sp=args.sp), jax.devices()[: args.sp])
    start = time.perf_counter()
    params = llama.init_params(config, jax.random.key(0), mesh)
    result = {
        "preset": args.preset,
        "device": jax.devices()[0].device_kind,
        "dtype": args.dtype,
        "batch": args.batch,
        "sp": args.sp,
        "attention": args.attention,
        "decode_steps": args.decode_steps,
        "baseline_steps": args.baseline_steps,
        "rows": [],
        "notes": [],
    }
    if args.contexts:
        contexts = [int(c) for c in args.contexts.split(",") if c]
    else:
        contexts, c = [], args.min_context
        while c <= args.max_context:
            contexts.append(c)
            c *= 2
    for context in contexts:
        if time.perf_counter() - start > args.time_budget:
            result["notes"].append(
                f"stopped before context {context}: time budget {args.time_budget:.0f} s spent"
            )
            break
        try:
            row = measure(config, params, context, args, mesh)
        except Exception as e:  # noqa: BLE001  out of memory ends the sweep
            if not _is_oom(e):
                raise
            result["notes"].append(f"context {context}: out of memory ({str(e).splitlines()[0]})")
            break
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        result["total_s"] = time.perf_counter() - start
        write(result, args.out)  # after every context: a run cut short keeps what it measured
        gc.collect()
    result["total_s"] = time.perf_counter() - start
    write(result, args.out)
    return result


def write(result: dict, out: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    write_md(result, out + ".md")


if __name__ == "__main__":
    main()
