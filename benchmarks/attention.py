"""Attention benchmark: ring_attention (N=1) per implementation next to the platform's best kernel.

On GPU the in-run baseline is cuDNN (``jax.nn.dot_product_attention(implementation="cudnn")``); on TPU
it is splash attention (falling back to XLA's ``jax.nn.dot_product_attention``). For each shape this
script first checks correctness on the device (every implementation against the baseline, and both
against a float32 reference on a short prefix), then times forward and forward+backward with warm-up
and the median of repeated runs, and writes JSON plus a Markdown table.

  python benchmarks/attention.py --impls xla --seqs 16384,65536 --out benchmarks/results/xla_h200

FLOPs: forward 4*B*H*L*L*D (halved when causal); forward+backward 3.5x forward (the FlashAttention
convention: the backward does 2.5x the forward's matmul work). ``--sp 1,2`` also times rings of several
devices (inputs in ``--layout`` order, sharded once outside the timing); TFLOP/s are per device.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import ringattention
from ringattention import implementations


def flops(b, h, l, d, causal, mode):
    f = 4.0 * b * h * l * l * d * (0.5 if causal else 1.0)
    return f * (3.5 if mode == "fwdbwd" else 1.0)


def time_fn(fn, args, warmup=1, reps=10, budget_s=20.0):
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    t_start = time.perf_counter()
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
        # long calls (tens of seconds each) vary little: two timed runs suffice
        if time.perf_counter() - t_start > budget_s and len(times) >= (2 if times[0] > 10 else 3):
            break
    return statistics.median(times)


def baseline_fn(platform, causal):
    if platform == "gpu":
        return lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=causal, implementation="cudnn"
        ), "cudnn"
    if platform == "tpu":
        try:
            return _splash(causal), "splash"
        except Exception as e:  # noqa: BLE001 - report and fall back
            print(f"splash attention unavailable ({e!r}); baseline is XLA")
    return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal), "xla_sdpa"


def _splash(causal):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    def fn(q, k, v):
        b, l, h, d = q.shape
        mask_cls = sm.CausalMask if causal else sm.FullMask
        mask = sm.MultiHeadMask([mask_cls((l, l)) for _ in range(h)])
        kernel = sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1)
        rep = h // k.shape[2]
        t = lambda x: jnp.repeat(x, rep, axis=2).transpose(0, 2, 1, 3)  # [b, h, l, d]
        out = jax.vmap(kernel)(t(q) * d**-0.5, t(k), t(v))
        return out.transpose(0, 2, 1, 3)

    return fn


def block_sizes_for(impl, spec, head_dim=None, causal=True):
    """``spec`` like "q_chunk=2048,kv_chunk=1024" (values that are not integers stay strings, e.g.
    "backward=mosaic") -> that implementation's BlockSizes (or None): ``BlockSizes(**fields)``,
    except for ``pallas_hopper``, whose per-head-dim defaults also pick the backward kernel and the
    register split: there the fields replace those of ``default_block_sizes(head_dim, causal)``."""
    if not spec:
        return None
    kv = dict(item.split("=") for item in spec.split(","))
    fields = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in kv.items()}
    mod = implementations.resolve(impl).load()
    if impl == "pallas_hopper" and head_dim is not None:
        return dataclasses.replace(mod.default_block_sizes(head_dim, causal), **fields)
    return mod.BlockSizes(**fields)


def ring_fn(impl, causal, block_sizes=None, deterministic=False, n=1, layout="zigzag"):
    """ring_attention on a ring of the first ``n`` devices; inputs in ``layout`` order for ``n``."""
    mesh = Mesh(np.array(jax.devices()[:n]), ("sp",))
    spec = P(None, "sp")

    def local(q, k, v):
        return ringattention.ring_attention(
            q,
            k,
            v,
            "sp",
            causal=causal,
            implementation=impl,
            block_sizes=block_sizes,
            deterministic=deterministic,
            layout=layout if n > 1 else "contiguous",
        )

    return jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec, check_vma=False)


def layout_io(n, layout):
    """(to, back): a natural-order array to ``layout`` order sharded over the first ``n`` devices, and
    a ring output back to natural order (outside the timed functions)."""
    if n == 1:
        return (lambda x: x), (lambda x: x)
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:n]), ("sp",)), P(None, "sp"))
    to = lambda x: jax.device_put(ringattention.layouts.to_layout(x, layout, n), sharding)  # noqa: E731
    return to, jax.jit(lambda x: ringattention.layouts.from_layout(x, layout, n))


def bare_fns(impl, causal, block_sizes=None, deterministic=False):
    """The implementation's forward step, and forward + backward steps, without the ring."""
    resolved = implementations.resolve(impl)
    mod = resolved.load()

    def kw_for(q):  # deterministic: the block sizes ring_attention(deterministic=True) would use
        bs = (
            implementations.deterministic_block_sizes(resolved, block_sizes, q.shape[-1], causal)
            if deterministic
            else block_sizes
        )
        return dict(causal=causal, block_sizes=bs)

    def fwd(q, k, v):
        kw = kw_for(q)
        pos = jnp.arange(q.shape[1], dtype=jnp.int32)
        o, lse = mod.forward_step(q, k, v, pos, pos, None, None, softmax_scale=q.shape[-1] ** -0.5, **kw)
        return o.astype(q.dtype), lse

    def fwdbwd(q, k, v, do):
        kw = kw_for(q)
        pos = jnp.arange(q.shape[1], dtype=jnp.int32)
        o, lse = fwd(q, k, v)
        delta = jnp.einsum("bshd,bshd->bhs", o.astype(jnp.float32), do)
        return mod.backward_step(
            q,
            k,
            v,
            do.astype(q.dtype),
            lse,
            delta,
            pos,
            pos,
            None,
            None,
            softmax_scale=q.shape[-1] ** -0.5,
            **kw,
        )

    return (lambda q, k, v: fwd(q, k, v)[0]), fwdbwd


def fwdbwd(fn):
    def loss(q, k, v, do):
        return jnp.sum(fn(q, k, v).astype(jnp.float32) * do)

    return jax.grad(loss, argnums=(0, 1, 2))


def rel(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def check(fns, q, k, v, causal, prefix=2048):
    """Errors of every fn against a float32 reference on a prefix (causal) or short copy."""
    qs, ks, vs = (x[:, :prefix] for x in (q, k, v))
    ref = ringattention.reference_attention(
        qs.astype(jnp.float32), ks.astype(jnp.float32), vs.astype(jnp.float32), causal=causal
    )
    errs = {}
    for name, f in fns.items():
        try:
            errs[name] = rel(jax.jit(f)(qs, ks, vs), ref)
        except Exception as e:  # noqa: BLE001 - e.g. a sweep candidate that does not compile
            print(f"{name}: {e!r}"[:300])
            errs[name] = float("nan")
    return errs


def bench_shape(args, impls, b, l, h, kvh, d, causal):
    key = jax.random.PRNGKey(l + d + kvh + causal)
    kq, kk, kv, kd = jax.random.split(key, 4)
    dt = jnp.dtype(args.dtype)
    q = jax.random.normal(kq, (b, l, h, d), dt)
    k = jax.random.normal(kk, (b, l, kvh, d), dt)
    v = jax.random.normal(kv, (b, l, kvh, d), dt)
    do = jax.random.normal(kd, (b, l, h, d), jnp.float32)
    platform = jax.default_backend()
    base, base_name = baseline_fn(platform, causal)
    fns = {base_name: (base, fwdbwd(base), 1)}  # name -> (fwd, fwd+bwd, devices)
    rings = [int(x) for x in str(args.sp).split(",")]
    for impl in impls:
        bs = block_sizes_for(impl, args.block, d, causal)
        for det in (False, True) if args.deterministic else (False,):
            tag = f"{impl}" + (f" {args.block}" if args.block else "") + (" deterministic" if det else "")
            for n in rings if not args.sweep else ():
                f = ring_fn(impl, causal, bs, det, n, args.layout)
                fns[f"ring[{tag}]" + (f" sp={n} {args.layout}" if n > 1 else "")] = (f, fwdbwd(f), n)
            if args.bare:
                fns[f"bare[{tag}]"] = (*bare_fns(impl, causal, bs, det), 1)
        for spec in filter(None, args.sweep.split(";")):  # bare step per BlockSizes candidate
            bs = block_sizes_for(impl, spec, d, causal)
            fns[f"bare[{impl} {spec}]"] = (*bare_fns(impl, causal, bs), 1)
    io = {n: layout_io(n, args.layout) for n in {n for *_, n in fns.values()}}
    natural = lambda f, n: lambda *a: io[n][1](f(*map(io[n][0], a)))  # noqa: E731 (not timed)
    errs = check({name: natural(f, n) for name, (f, _, n) in fns.items()}, q, k, v, causal)
    base_out = jax.jit(base)(q, k, v)
    rows = []
    for name, (f, fb, n) in fns.items():
        row = dict(
            name=name,
            batch=b,
            seq=l,
            heads=h,
            kv_heads=kvh,
            head_dim=d,
            causal=causal,
            dtype=args.dtype,
            devices=n,
            err_vs_f32_ref_prefix=errs[name],
        )
        try:
            to = io[n][0]
            ins = (to(q), to(k), to(v))
            row["err_vs_baseline"] = rel(io[n][1](jax.jit(f)(*ins)), base_out)
            for mode, g in (("fwd", jax.jit(f)), ("fwdbwd", jax.jit(fb))):
                a = ins if mode == "fwd" else (*ins, to(do))
                t = time_fn(g, a, reps=args.reps)
                row[f"{mode}_ms"] = t * 1e3
                row[f"{mode}_tflops"] = flops(b, h, l, d, causal, mode) / t / 1e12 / n  # per device
        except Exception as e:  # noqa: BLE001 - a failing variant is recorded, not fatal
            row["error"] = repr(e)[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)
    base_row = rows[0]
    for row in rows:
        for mode in ("fwd", "fwdbwd"):
            if f"{mode}_tflops" in row and f"{mode}_tflops" in base_row:
                row[f"{mode}_vs_{base_name}"] = row[f"{mode}_tflops"] / base_row[f"{mode}_tflops"]
    return rows


def table(rows):
    cols = [
        "name",
        "devices",
        "seq",
        "heads",
        "kv_heads",
        "head_dim",
        "causal",
        "fwd_tflops",
        "fwdbwd_tflops",
        "err_vs_baseline",
    ]
    ratio_cols = sorted({c for r in rows for c in r if "_vs_" in c and c != "err_vs_baseline"})
    cols += ratio_cols
    fmt = lambda x: f"{x:.3g}" if isinstance(x, float) else str(x)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--impls", default="xla", help="comma-separated implementations")
    ap.add_argument("--seqs", default="16384,65536")
    ap.add_argument("--causal", default="1,0", help="comma-separated 1/0")
    ap.add_argument("--shapes", default="32:32:128", help="heads:kv_heads:head_dim, comma-separated")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--bare", action="store_true", help="also time the bare step (no ring)")
    ap.add_argument("--block", default="", help='BlockSizes fields, e.g. "q_chunk=2048,kv_chunk=1024"')
    ap.add_argument("--sweep", default="", help='";"-separated --block specs, timed as bare steps (no ring)')
    ap.add_argument(
        "--deterministic",
        action="store_true",
        help="also time every implementation with deterministic=True (rows tagged "
        '"deterministic"): the speed cost of kernels whose sums have a fixed order',
    )
    ap.add_argument(
        "--sp", default="1", help="comma-separated ring sizes (devices on the ring); TFLOP/s are per device"
    )
    ap.add_argument("--layout", default="zigzag", help="layout of rings of more than one device")
    ap.add_argument("--out", default=None, help="path prefix for .json and .md")
    args = ap.parse_args(argv)
    impls = args.impls.split(",")
    meta = dict(
        date=datetime.date.today().isoformat(),
        jax=jax.__version__,
        device=str(jax.devices()[0].device_kind),
        platform=jax.default_backend(),
        args=vars(args),
    )
    rows = []
    for shape in args.shapes.split(","):
        h, kvh, d = (int(x) for x in shape.split(":"))
        for l in (int(x) for x in args.seqs.split(",")):
            for causal in (bool(int(c)) for c in args.causal.split(",")):
                rows += bench_shape(args, impls, args.batch, l, h, kvh, d, causal)
                write(args.out, meta, rows)  # after every shape: a cut-off run keeps its rows
    print(f"{meta['date']}, jax {meta['jax']}, {meta['device']}\n\n{table(rows)}\n")
    return rows


def write(out, meta, rows):
    if not out:
        return
    with open(out + ".json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    with open(out + ".md", "w") as f:
        f.write(f"{meta['date']}, jax {meta['jax']}, {meta['device']}\n\n{table(rows)}\n")


if __name__ == "__main__":
    main()
