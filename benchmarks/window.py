"""Sliding-window attention speed on one device: window W against full causal attention.

``ring_attention(..., sliding_window=W)`` on a ring of one (blocks wholly outside the window are never
loaded) next to cuDNN's sliding-window kernel (``jax.nn.dot_product_attention(local_window_size=(W - 1,
0))``; on CPU the XLA one), each with and without the window, forward and forward+backward, over
long sequences (Mistral-style causal windows; Jiang et al. 2023). Before timing, every windowed
path is checked against a float32 reference with the window on a sequence of ``2 W``: output and
dq, dk, dv (relative errors; bf16 paths should stay below ``CHECK_RTOL``).

    python benchmarks/window.py --out benchmarks/results/window_h200   # H200: 128K..1M, W = 4096
    python benchmarks/window.py --tiny --out /tmp/window_cpu           # CPU smoke test

Full causal attention is quadratic: it is timed up to ``--full-max`` tokens and while the
``--time-budget`` allows (the predicted cost of the next length, from the last one scaled by
``(L / L_prev)^2``, must fit); longer rows say why they were not run. TFLOP/s count the visible
(query, key) pairs: forward ``4 * B * H * D * pairs``, forward+backward 3.5x that, with ``pairs =
L * W - W * (W - 1) / 2`` for a causal window and ``L * (L + 1) / 2`` for full causal attention.
Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ringattention  # noqa: E402

FWDBWD_FACTOR = 3.5  # the FlashAttention convention: backward = 2.5x the forward's matmuls
CHECK_RTOL = {"bfloat16": 2e-2, "float16": 1e-2, "float32": 1e-5}  # as tests/ringcheck.py


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seqs", default="131072,262144,524288,1048576")
    p.add_argument("--window", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--impls", default="pallas_hopper", help="comma-separated ring implementations")
    p.add_argument("--no-baseline", action="store_true", help="skip cuDNN (XLA on CPU)")
    p.add_argument("--full-max", type=int, default=262144, help="longest full-causal run")
    p.add_argument("--reps", type=int, default=3, help="timed runs (median) after one warm-up")
    p.add_argument(
        "--time-budget",
        type=float,
        default=150.0,
        help="seconds; no full-causal length is started that would not fit",
    )
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: small shapes, xla, float32")
    p.add_argument("--out", default=None, help="output path prefix (.json and .md are added)")
    if p.parse_args(argv).tiny:  # smaller defaults; flags given still win
        p.set_defaults(
            seqs="128,256",
            window=32,
            heads=2,
            kv_heads=1,
            head_dim=16,
            impls="xla",
            full_max=256,
            reps=1,
            dtype="float32",
        )
    return p.parse_args(argv)


def pairs(seq: int, window: int | None) -> int:
    """Visible (query, key) pairs of causal attention over ``seq`` tokens (with a window)."""
    if window is None or window >= seq:
        return seq * (seq + 1) // 2
    return seq * window - window * (window - 1) // 2


def ring_fn(impl: str, window: int | None):
    mesh = Mesh(np.array(jax.devices()[:1]), ("sp",))
    spec = P(None, "sp")

    def local(q, k, v):
        return ringattention.ring_attention(
            q, k, v, "sp", causal=True, implementation=impl, sliding_window=window
        )

    return jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec, check_vma=False)


def baseline_fn(window: int | None):
    """jax.nn.dot_product_attention: cuDNN on GPU (named "cudnn"), XLA elsewhere ("xla_sdpa")."""
    kind = "cudnn" if jax.default_backend() == "gpu" else "xla"
    local = None if window is None else (window - 1, 0)  # keys i - (W - 1) .. i
    fn = lambda q, k, v: jax.nn.dot_product_attention(  # noqa: E731
        q, k, v, is_causal=True, local_window_size=local, implementation=kind
    )
    return fn, "cudnn" if kind == "cudnn" else "xla_sdpa"


def fwdbwd(fn):
    def loss(q, k, v, do):
        return jnp.sum(fn(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))

    return jax.grad(loss, argnums=(0, 1, 2))


def time_fn(fn, args, reps: int) -> float:
    jax.block_until_ready(fn(*args))  # compile + warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def inputs(args, seq: int, seed: int = 0):
    keys = jax.random.split(jax.random.PRNGKey(seed + seq), 4)
    dt = jnp.dtype(args.dtype)
    b, h, kvh, d = args.batch, args.heads, args.kv_heads, args.head_dim
    return (
        jax.random.normal(keys[0], (b, seq, h, d), dt),
        jax.random.normal(keys[1], (b, seq, kvh, d), dt),
        jax.random.normal(keys[2], (b, seq, kvh, d), dt),
        jax.random.normal(keys[3], (b, seq, h, d), dt),
    )


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _with_grads(fn):
    return jax.jit(lambda q, k, v, do: (fn(q, k, v), *fwdbwd(fn)(q, k, v, do)))


def check(args, fns) -> dict:
    """{name: {o, dq, dk, dv: relative error, ok}} of every windowed fn against a float32
    reference with the window at L = 2 W (inputs rounded to ``args.dtype`` for both)."""
    q, k, v, do = inputs(args, 2 * args.window, seed=1)
    ref_fn = lambda q, k, v: ringattention.reference_attention(  # noqa: E731
        q, k, v, causal=True, sliding_window=args.window
    )
    want = _with_grads(ref_fn)(*(x.astype(jnp.float32) for x in (q, k, v, do)))
    out = {}
    for name, fn in fns.items():
        got = _with_grads(fn)(q, k, v, do)
        errs = {n: rel(g, w) for n, g, w in zip(("o", "dq", "dk", "dv"), got, want, strict=True)}
        out[name] = dict(errs, ok=all(e <= CHECK_RTOL[args.dtype] for e in errs.values()))
    return out


def measure(fn, name, args, seq, window, reps) -> dict:
    print(f"RUN {name} seq={seq} window={window}", flush=True)  # names a hung or failing run
    q, k, v, do = inputs(args, seq)
    row = dict(
        name=name,
        seq=seq,
        window=window,
        heads=args.heads,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        dtype=args.dtype,
    )
    flop = 4.0 * args.batch * args.heads * args.head_dim * pairs(seq, window)
    try:
        for mode, g, a, f in (
            ("fwd", jax.jit(fn), (q, k, v), flop),
            ("fwdbwd", jax.jit(fwdbwd(fn)), (q, k, v, do), FWDBWD_FACTOR * flop),
        ):
            t = time_fn(g, a, reps)
            row[f"{mode}_ms"], row[f"{mode}_tflops"] = t * 1e3, f / t / 1e12
    except Exception as e:  # noqa: BLE001 - a failing variant is recorded, not fatal
        row["error"] = repr(e)[:300]
    print(json.dumps(row), flush=True)
    return row


def summary(rows) -> list[dict]:
    """Per implementation and length: window vs full causal time, and the ideal ratio (pairs)."""
    out = []
    full = {(r["name"], r["seq"]): r for r in rows if r["window"] is None and "fwd_ms" in r}
    for r in rows:
        if r["window"] is None or "fwd_ms" not in r:
            continue
        s = dict(
            name=r["name"],
            seq=r["seq"],
            window=r["window"],
            ideal_speedup=pairs(r["seq"], None) / pairs(r["seq"], r["window"]),
        )
        f = full.get((r["name"], r["seq"]))
        for mode in ("fwd", "fwdbwd"):
            s[f"{mode}_ms"] = r.get(f"{mode}_ms")
            s[f"full_{mode}_ms"] = f.get(f"{mode}_ms") if f else None
            s[f"{mode}_speedup"] = f[f"{mode}_ms"] / r[f"{mode}_ms"] if f else None
        out.append(s)
    return out


def run(args) -> dict:
    seqs = [int(x) for x in args.seqs.split(",")]
    fns = {impl: (lambda w, impl=impl: ring_fn(impl, w)) for impl in args.impls.split(",")}
    base_name = None
    if not args.no_baseline:
        base_name = baseline_fn(None)[1]
        fns[base_name] = lambda w: baseline_fn(w)[0]
    t_start = time.perf_counter()
    errors = check(args, {name: make(args.window) for name, make in fns.items()})
    print(json.dumps({"err_vs_f32_reference_at_2W": errors}), flush=True)
    rows = []
    for seq in seqs:  # windowed: linear in the length, always run
        rows += [
            measure(make(args.window), name, args, seq, args.window, args.reps) for name, make in fns.items()
        ]
    for name, make in fns.items():  # full causal: quadratic, within --full-max and the budget
        last = None
        for seq in seqs:
            left = args.time_budget - (time.perf_counter() - t_start)
            guess = None if last is None else (last[1] * (seq / last[0]) ** 2) * (args.reps + 1)
            if seq > args.full_max or (guess is not None and guess > left):
                rows.append(
                    dict(
                        name=name,
                        seq=seq,
                        window=None,
                        skipped=(
                            f"seq > --full-max {args.full_max}"
                            if seq > args.full_max
                            else f"predicted {guess:.0f} s > {left:.0f} s left of --time-budget"
                        ),
                    )
                )
                continue
            row = measure(make(None), name, args, seq, None, args.reps)
            rows.append(row)
            if "fwdbwd_ms" in row:
                last = (seq, (row["fwd_ms"] + row["fwdbwd_ms"]) / 1e3)
    meta = dict(
        date=datetime.date.today().isoformat(),
        jax=jax.__version__,
        device=str(jax.devices()[0].device_kind),
        platform=jax.default_backend(),
        baseline=base_name,
        wall_s=time.perf_counter() - t_start,
        args=vars(args),
    )
    return dict(meta=meta, err_vs_f32_reference_at_2W=errors, rows=rows, summary=summary(rows))


def table(result) -> str:
    cols = [
        "name",
        "seq",
        "window",
        "fwd_ms",
        "full_fwd_ms",
        "fwd_speedup",
        "fwdbwd_ms",
        "full_fwdbwd_ms",
        "fwdbwd_speedup",
        "ideal_speedup",
    ]
    fmt = lambda x: f"{x:.4g}" if isinstance(x, float) else ("-" if x is None else str(x))  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(s.get(c)) for c in cols) + " |" for s in result["summary"]]
    skipped = [
        f"- {r['name']} full causal at {r['seq']}: not run ({r['skipped']})"
        for r in result["rows"]
        if "skipped" in r
    ]
    m = result["meta"]
    head = (
        f"{m['date']}, jax {m['jax']}, {m['device']}, {m['args']['dtype']}, heads "
        f"{m['args']['heads']}:{m['args']['kv_heads']}:{m['args']['head_dim']}, window "
        f"{m['args']['window']}, ring of one, {m['wall_s']:.0f} s. Errors against a float32 "
        "reference with the window at L = 2W:"
    )
    errs = [
        f"- {name}: "
        + " ".join(f"{n}={e[n]:.2e}" for n in ("o", "dq", "dk", "dv"))
        + (" ok" if e["ok"] else " FAIL")
        for name, e in result["err_vs_f32_reference_at_2W"].items()
    ]
    return "\n".join([head, *errs, "", *lines, "", *skipped]) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = run(args)
    text = table(result)
    print(text)
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump(result, f, indent=1)
        with open(args.out + ".md", "w") as f:
            f.write(text)
    return result


if __name__ == "__main__":
    main()
