"""What each attention option costs, and `check_vma`, against the plain ring in the same run.

On one device (a ring of one inside ``jax.shard_map``), ``implementation="auto"``: the plain causal
ring, then the same call with one option each (``sinks``, ``logits_soft_cap``, ``prefix_length``,
``bidirectional_segments``, a value head dim of 128 under a query/key head dim of 192) and the plain
ring under ``shard_map(check_vma=False)``. Every variant is first checked against the float32
``reference_attention`` on the device; times are medians after a warm-up, with cuDNN's causal
attention (GPU) in the same run as the yardstick. "auto" names the kernel each variant ran on (an
option the fastest kernel lacks falls back to the next one that has it).

  python benchmarks/options.py --seq 65536 --out benchmarks/results/options_h100
  python benchmarks/options.py --tiny          # CPU smoke test (auto is xla there)

FLOPs per variant: forward 2*B*H*L*L*(D + Dv) halved when causal (the prefix's extra keys are
counted), forward+backward 3.5x that; TFLOP/s are per device.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import attention as bench  # noqa: E402  (time_fn, baseline_fn)
from work_counts import git_commit  # noqa: E402

import ringattention as ra  # noqa: E402


def variants(seq: int) -> dict[str, dict]:
    """name -> ring_attention keywords (``qk_dim``: a query/key head dim of its own; ``check_vma``:
    the shard_map's)."""
    return {
        "plain": {},
        "sinks": dict(sinks=True),
        "softcap 50": dict(logits_soft_cap=50.0),
        "prefix L/4": dict(prefix_length=seq // 4),
        "bidirectional segments": dict(bidirectional_segments=True),
        "head dims 192/128": dict(qk_dim=192),
        "check_vma=False": dict(check_vma=False),
    }


def _inputs(args, seq: int, qk_dim: int):
    B, H, K, D = 1, args.heads, args.kv_heads, args.head_dim
    kq, kk, kv, kd = jax.random.split(jax.random.PRNGKey(0), 4)
    dt = jnp.dtype(args.dtype)
    return (jax.random.normal(kq, (B, seq, H, qk_dim), dt),  # q [B, L, H, Dqk]
            jax.random.normal(kk, (B, seq, K, qk_dim), dt),  # k [B, L, K, Dqk]
            jax.random.normal(kv, (B, seq, K, D), dt),  # v [B, L, K, D]
            jax.random.normal(kd, (B, seq, H, D), dt))  # do [B, L, H, D]


def _segments(seq: int):
    """Four documents per row, the 2nd and 4th bidirectional (negative ids). int32 [1, L]."""
    ids = np.repeat(np.arange(1, 5), seq // 4)
    return jnp.asarray(np.where(ids % 2 == 0, -ids, ids)[None], jnp.int32)


def make_fns(opts: dict, seq: int, heads: int, mesh):
    """(the variant inside shard_map, the float32 reference) as functions of q, k, v."""
    kw = {o: x for o, x in opts.items() if o not in ("check_vma", "qk_dim", "sinks")}
    seg = _segments(seq) if opts.get("bidirectional_segments") else None
    if opts.get("sinks"):
        kw["sinks"] = jnp.linspace(-1.0, 1.0, heads, dtype=jnp.float32)
    if "prefix_length" in kw:  # the same fraction of the sequence at any length
        kw["prefix_length"] = jnp.full((1,), seq // 4, jnp.int32)
    spec = P(None, "sp")

    def local(q, k, v, s):
        return ra.ring_attention(q, k, v, "sp", causal=True, segment_ids=s, **kw)

    fn = jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, spec), out_specs=spec,
                       check_vma=opts.get("check_vma", True))
    ref = lambda q, k, v: ra.reference_attention(q, k, v, causal=True, segment_ids=seg, **kw)  # noqa: E731
    return (lambda q, k, v: fn(q, k, v, seg)), ref


def picked(opts: dict, seq: int, mesh) -> str:
    """The kernel "auto" runs the variant on."""
    names = {"logits_soft_cap": "softcap", "prefix_length": "prefix",
             "bidirectional_segments": "bidirectional", "qk_dim": "v_head_dim"}
    used = frozenset(f for o, f in names.items() if o in opts)
    return ra.implementations.resolve("auto", mesh, shard=seq, needs=used).name


def check(opts: dict, args, mesh) -> float:
    """Max abs error against the float32 reference on ``check_len`` tokens, float32 inputs."""
    n = min(args.seq, args.check_len)
    q, k, v, _ = (x.astype(jnp.float32) for x in _inputs(args, n, opts.get("qk_dim", args.head_dim)))
    fn, ref = make_fns(opts, n, args.heads, mesh)
    return float(jnp.max(jnp.abs(jax.jit(fn)(q, k, v) - jax.jit(ref)(q, k, v))))


def run(args) -> list[dict]:
    mesh = Mesh(np.array(jax.devices()[:1]), ("sp",))
    rows = []
    chosen = variants(args.seq)
    if args.variants:
        chosen = {n: chosen[n] for n in ["plain", *args.variants.split(",")] if n in chosen}
    for name, opts in chosen.items():
        q, k, v, do = _inputs(args, args.seq, opts.get("qk_dim", args.head_dim))
        fn, _ = make_fns(opts, args.seq, args.heads, mesh)
        f = jax.jit(fn)
        fb = jax.jit(lambda q, k, v, do, fn=fn: jax.vjp(fn, q, k, v)[1](do))
        row = dict(variant=name, implementation=picked(opts, args.seq, mesh),
                   max_abs_err=check(opts, args, mesh),
                   fwd_ms=1e3 * bench.time_fn(f, (q, k, v), reps=args.reps),
                   fwdbwd_ms=1e3 * bench.time_fn(lambda *a: (f(*a[:3]), fb(*a)), (q, k, v, do),
                                                 reps=args.reps))
        rows.append(row)
        print(json.dumps(row), flush=True)
    if jax.devices()[0].platform == "gpu":  # the yardstick: cuDNN, plain causal, same run
        base, _ = bench.baseline_fn("gpu", True)
        q, k, v, _ = _inputs(args, args.seq, args.head_dim)
        rows[0]["cudnn_fwd_ms"] = 1e3 * bench.time_fn(jax.jit(base), (q, k, v), reps=args.reps)
    for r in rows:
        r["fwd_vs_plain"] = rows[0]["fwd_ms"] / r["fwd_ms"]
        r["fwdbwd_vs_plain"] = rows[0]["fwdbwd_ms"] / r["fwdbwd_ms"]
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| variant | auto ran | fwd ms | fwd+bwd ms | speed vs plain (fwd / fwd+bwd) | max abs err |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['implementation']} | {r['fwd_ms']:.2f} | "
                     f"{r['fwdbwd_ms']:.2f} | {r['fwd_vs_plain']:.2f}x / {r['fwdbwd_vs_plain']:.2f}x | "
                     f"{r['max_abs_err']:.1e} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=65536)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv_heads", type=int, default=8)
    p.add_argument("--head_dim", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--check_len", type=int, default=2048)
    p.add_argument("--variants", default="", help="comma-separated names (default: all); plain "
                   "always runs first")
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: 256 tokens, 4:2 heads, 32")
    p.add_argument("--out", default=None, help="prefix of the .json/.md to write")
    p.add_argument("--commit", default=None, help="the commit measured (default: git's HEAD)")
    args = p.parse_args(argv)
    if args.tiny:
        args.seq, args.heads, args.kv_heads, args.head_dim = 256, 4, 2, 32
        args.dtype, args.reps, args.check_len = "float32", 1, 128
    rows = run(args)
    meta = dict(date=datetime.date.today().isoformat(), commit=args.commit or git_commit(),
                device=jax.devices()[0].device_kind, jax=jax.__version__, seq=args.seq,
                heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim, dtype=args.dtype)
    md = table(rows)
    print(md)
    result = dict(meta=meta, rows=rows)
    if args.out:
        pathlib.Path(args.out + ".json").write_text(json.dumps(result, indent=1))
        head = " ".join(f"{k}={v}" for k, v in meta.items())
        pathlib.Path(args.out + ".md").write_text(f"# Attention options against the plain ring\n\n"
                                                  f"{head}\n\n{md}\n")
    return result


if __name__ == "__main__":
    main()
