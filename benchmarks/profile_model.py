"""Where the time of one LLaMA training step goes: a device trace, summed per kernel and per category.

Traces one forward+backward of ``benchmarks/model.py``'s loss (same config options) with
``jax.profiler`` and reads the trace back with ``jax.profiler.ProfileData`` (no TensorBoard
plugin needed), then sums the device time of every kernel and of five categories: matmul (cuBLAS /
cuDNN GEMMs), attention (our Pallas kernels, cuDNN attention), fusion (XLA elementwise / reduction
kernels), copy (memcpy / memset / transposes) and other. The share of each
category against the step's wall time says what to optimise first.

    python benchmarks/profile_model.py --seq 32768 --remat none --out /tmp/profile_32k.json
    python benchmarks/profile_model.py --tiny          # CPU smoke test (host events only)
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import sys
import tempfile
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import model as bench  # noqa: E402

from models import llama  # noqa: E402

CATEGORIES = (
    (
        "attention",
        re.compile(r"ring_step|fwd_kernel|dq_kernel|dkv_kernel|flash|fmha|attention|mosaic|cudnn", re.I),
    ),
    ("matmul", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|matmul|dot", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy|transpose", re.I)),
    ("fusion", re.compile(r"fusion|reduce|loop_|input_|convert|scatter|gather", re.I)),
)


def category(name: str) -> str:
    for cat, pattern in CATEGORIES:
        if pattern.search(name):
            return cat
    return "other"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="1b")
    p.add_argument("--seq", type=int, default=32768)
    p.add_argument("--remat", default=None)
    p.add_argument("--mlp-chunk", type=int, default=None)
    p.add_argument("--loss-chunk", type=int, default=None)
    p.add_argument("--attention", default="auto")
    p.add_argument("--top", type=int, default=30, help="kernels listed")
    p.add_argument("--tiny", action="store_true", help="debug preset, 128 tokens (CPU test)")
    p.add_argument("--out", default=None, help="JSON path for the summary")
    return p.parse_args(argv)


SUMMARY_LINES = ("XLA Modules", "XLA Ops", "Steps", "Framework Ops", "Source code")


def device_events(xspace_path: str) -> tuple[list, list]:
    """(kernels, hlo_ops): (name, seconds) of every kernel on a device plane's stream lines and of
    every op on its "XLA Ops" line; host events as kernels when there is no device plane (CPU)."""
    data = jax.profiler.ProfileData.from_file(xspace_path)
    planes = list(data.planes)
    devices = [p for p in planes if p.name.startswith("/device:")]
    kernels, ops = [], []
    for plane in devices or [p for p in planes if p.name.startswith("/host:CPU")]:
        for line in plane.lines:
            target = ops if line.name == "XLA Ops" else kernels
            if devices and line.name in SUMMARY_LINES and line.name != "XLA Ops":
                continue  # summaries of the kernels on the stream lines; counted once there
            for ev in line.events:
                target.append((ev.name, ev.duration_ns * 1e-9))
    return kernels, ops


def summarize(events: list[tuple[str, float]], wall_s: float, top: int) -> dict:
    per_kernel = collections.defaultdict(lambda: [0.0, 0])
    for name, sec in events:
        per_kernel[name][0] += sec
        per_kernel[name][1] += 1
    per_cat = collections.Counter()
    for name, (sec, _) in per_kernel.items():
        per_cat[category(name)] += sec
    busy = sum(per_cat.values())
    kernels = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "wall_s": wall_s,
        "device_busy_s": busy,
        "categories": {k: {"s": v, "of_wall": v / wall_s} for k, v in per_cat.most_common()},
        "top_kernels": [
            {"name": n[:160], "s": s, "count": c, "category": category(n)} for n, (s, c) in kernels
        ],
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    margs = bench.parse_args([])
    for field in ("preset", "remat", "mlp_chunk", "loss_chunk", "attention", "tiny"):
        setattr(margs, field, getattr(args, field))
    config = bench.make_config(margs)
    seq = 128 if args.tiny else args.seq
    params = llama.init_params(config, jax.random.key(0))
    batch = bench.make_batch(config, seq)
    grad = jax.jit(jax.grad(lambda p, b: llama.loss_fn(config, p, b)[0]))
    compiled = grad.lower(params, batch).compile()
    jax.block_until_ready(compiled(params, batch))  # warm-up
    trace_dir = tempfile.mkdtemp(prefix="ra_profile_")
    with jax.profiler.trace(trace_dir):
        t = time.perf_counter()
        jax.block_until_ready(compiled(params, batch))
        wall = time.perf_counter() - t
    path = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))[-1]
    kernels, ops = device_events(path)
    summary = summarize(kernels, wall, args.top)
    summary["hlo_ops"] = summarize(ops, wall, args.top) if ops else None
    flops = llama.flops_per_token(config, seq) * seq
    summary.update(
        seq=seq,
        preset="debug" if args.tiny else args.preset,
        remat=config.remat,
        attention=args.attention,
        mlp_chunk=config.mlp_chunk,
        model_tflops_per_s=flops / wall / 1e12,
        device=jax.devices()[0].device_kind,
        jax=jax.__version__,
        **bench.memory(compiled),
    )
    print(json.dumps({k: v for k, v in summary.items() if k not in ("top_kernels", "hlo_ops")}, indent=1))
    for part in (summary, summary["hlo_ops"] or {"top_kernels": []}):
        print("-" * 20)
        for row in part["top_kernels"]:
            print(f"{row['s'] * 1e3:10.2f} ms {row['count']:6d}x  {row['category']:9s} {row['name']}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    main()
