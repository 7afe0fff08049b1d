"""Speed of context parallelism on the visible devices: ring vs Ulysses vs Ulysses x ring.

For every factorisation P = U x N of the device count (U the Ulysses group, N the ring; U = 1 is the
ring alone, N = 1 Ulysses alone; DeepSpeed-Ulysses, Jacobs et al. 2023; USP, Fang & Zhao 2024) this
times one layer's attention through ``ringattention.sharded_attention`` on global arrays already in
the layout order of a ring of N and sharded over ("sp", "usp") (the reordering is not timed),
forward and forward+backward (warm-up, then the median of repeated runs), checks each scheme's
output and gradients against the first scheme's (in natural order), and writes JSON plus a Markdown
table. On 2 devices the schemes are the ring of 2 and Ulysses of 2; hybrids need 4+ devices.

    python benchmarks/cp_speed.py --out benchmarks/results/cp_speed_h200x2   # all visible GPUs
    python benchmarks/cp_speed.py --tiny                                     # CPU smoke test

TFLOP/s are per device: causal forward 2 B H L^2 D (4 B H L^2 D full), forward+backward 3.5x that.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention import flops, rel, time_fn  # noqa: E402

import ringattention  # noqa: E402
from ringattention import layouts  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=0, help="how many devices (0: all visible)")
    ap.add_argument("--grids", default="", help='"UxN,..." (default: every factorisation)')
    ap.add_argument("--seqs", default="65536,131072,262144")
    ap.add_argument("--shapes", default="32:8:128", help="heads:kv_heads:head_dim, comma-separated")
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--layout", default="zigzag")
    ap.add_argument("--impl", default="auto")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny shapes, xla, 2 reps")
    ap.add_argument("--out", default=None, help="path prefix for .json and .md")
    args = ap.parse_args(argv)
    if args.tiny:
        args.seqs, args.shapes, args.impl, args.reps = "256", "4:2:16", "xla", 2
    return args


def grids(args, count: int) -> list[tuple[int, int]]:
    """(Ulysses U, ring N) pairs with U * N == count."""
    if args.grids:
        out = [tuple(int(x) for x in g.split("x")) for g in args.grids.split(",")]
        bad = [g for g in out if g[0] * g[1] != count]
        if bad:
            raise ValueError(f"--grids {bad} do not multiply to the {count} devices")
        return out
    return [(u, count // u) for u in range(1, count + 1) if count % u == 0]


def scheme_name(u: int, n: int) -> str:
    return "ring" if u == 1 else ("ulysses" if n == 1 else "hybrid")


def make_fns(mesh, u: int, args):
    """jitted forward and forward+backward of global layout-ordered q, k, v (sharded inputs)."""
    kw = dict(
        seq_axis="sp",
        ulysses_axis="usp" if u > 1 else None,
        causal=bool(args.causal),
        layout=args.layout,
        reorder=False,
        implementation=args.impl,
    )
    fwd = lambda q, k, v: ringattention.sharded_attention(q, k, v, mesh, **kw)  # noqa: E731

    def loss(q, k, v, do):
        return jnp.sum(fwd(q, k, v).astype(jnp.float32) * do)

    return jax.jit(fwd), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def inputs(shape, seq: int, args):
    """q, k, v, do in natural order (on the default device)."""
    h, kvh, d = shape
    keys = jax.random.split(jax.random.PRNGKey(seq + d), 4)
    dt = jnp.dtype(args.dtype)
    q = jax.random.normal(keys[0], (1, seq, h, d), dt)
    k, v = (jax.random.normal(kk, (1, seq, kvh, d), dt) for kk in keys[1:3])
    return q, k, v, jax.random.normal(keys[3], (1, seq, h, d), jnp.float32)


def bench(args, devices, shape, seq: int) -> list[dict]:
    h, kvh, d = shape
    natural = inputs(shape, seq, args)
    rows, first = [], None
    for u, n in grids(args, len(devices)):
        mesh = Mesh(np.array(devices).reshape(n, u), ("sp", "usp"))
        sharding = NamedSharding(mesh, P(None, ("sp", "usp")))
        to = lambda x: jax.device_put(layouts.to_layout(x, args.layout, n), sharding)  # noqa: E731
        q, k, v, do = (to(x) for x in natural)
        row = dict(
            scheme=scheme_name(u, n),
            ulysses=u,
            ring=n,
            devices=len(devices),
            seq=seq,
            heads=h,
            kv_heads=kvh,
            head_dim=d,
            causal=bool(args.causal),
            layout=args.layout,
            impl=args.impl,
            dtype=args.dtype,
        )
        try:
            fwd, grad = make_fns(mesh, u, args)
            outs = tuple(layouts.from_layout(x, args.layout, n) for x in (fwd(q, k, v), *grad(q, k, v, do)))
            first = outs if first is None else first
            row["err_vs_first"] = max(rel(a, b) for a, b in zip(outs, first))
            for mode, fn, a in (("fwd", fwd, (q, k, v)), ("fwdbwd", grad, (q, k, v, do))):
                t = time_fn(fn, a, reps=args.reps)
                row[f"{mode}_ms"] = t * 1e3
                f = flops(1, h, seq, d, bool(args.causal), mode)
                row[f"{mode}_tflops_per_device"] = f / t / 1e12 / len(devices)
        except Exception as e:  # noqa: BLE001 - a failing scheme is recorded, not fatal
            row["error"] = repr(e)[:400]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def table(rows) -> str:
    cols = [
        "scheme",
        "ulysses",
        "ring",
        "seq",
        "heads",
        "kv_heads",
        "head_dim",
        "fwd_ms",
        "fwdbwd_ms",
        "fwd_tflops_per_device",
        "fwdbwd_tflops_per_device",
        "err_vs_first",
        "error",
    ]
    fmt = lambda x: f"{x:.4g}" if isinstance(x, float) else str(x)[:60]  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    devices = jax.devices()[: args.devices or None]
    meta = dict(
        date=datetime.date.today().isoformat(),
        jax=jax.__version__,
        device=str(devices[0].device_kind),
        count=len(devices),
        platform=jax.default_backend(),
        args=vars(args),
    )
    rows = []
    for shape in args.shapes.split(","):
        for seq in (int(s) for s in args.seqs.split(",")):
            rows += bench(args, devices, tuple(int(x) for x in shape.split(":")), seq)
            write(args.out, meta, rows)  # after every shape: a cut-off run keeps its rows
    print(f"{meta['date']}, jax {meta['jax']}, {meta['count']} x {meta['device']}\n\n{table(rows)}")
    return dict(meta=meta, rows=rows)


def write(out, meta, rows) -> None:
    if not out:
        return
    with open(out + ".json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    with open(out + ".md", "w") as f:
        f.write(
            f"{meta['date']}, jax {meta['jax']}, {meta['count']} x {meta['device']}, "
            f"`{' '.join(sys.argv)}`\n\n{table(rows)}\n"
        )


if __name__ == "__main__":
    main()
