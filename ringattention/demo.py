"""Demo: ring attention across 8 virtual CPU devices, checked against the naive reference.

  python -m ringattention.demo [--seq 4096] [--devices 8] [--layout zigzag]

Prints the error against ``reference_attention`` (forward and gradients), per-device memory from
XLA's compiled memory analysis for the ring and for the single-device reference, and wall time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--layout", default="zigzag")
    return ap.parse_args(argv)


def _host_devices(n: int) -> None:
    """n virtual CPU devices, where jax is not imported yet (it reads XLA_FLAGS once)."""
    if "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}"
        )
        os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _time_and_memory(name: str, f, args) -> None:
    """Compiles and runs ``f(*args)`` once; prints the times and XLA's per-device memory."""
    import jax

    t0 = time.perf_counter()
    compiled = f.lower(*args).compile()
    t1 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    t2 = time.perf_counter()
    mem = compiled.memory_analysis()
    per_dev = (mem.temp_size_in_bytes + mem.argument_size_in_bytes) / 2**20
    print(
        f"  {name:9s} compile {t1 - t0:5.1f} s, fwd+bwd {t2 - t1:6.2f} s, "
        f"per-device memory {per_dev:8.1f} MiB"
    )


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    _host_devices(args.devices)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import ringattention as ra

    n = args.devices
    if len(jax.devices()) < n:
        raise SystemExit(
            f"--devices={n} but jax sees {len(jax.devices())} device(s); on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={n} before jax is "
            "imported (make demo does)"
        )
    mesh = Mesh(np.array(jax.devices()[:n]), ("sp",))
    key = jax.random.split(jax.random.PRNGKey(0), 3)
    B, L, H, K, D = 1, args.seq, args.heads, args.kv_heads, args.head_dim
    q = jax.random.normal(key[0], (B, L, H, D))
    k, v = (jax.random.normal(kk, (B, L, K, D)) for kk in key[1:])
    seg = jnp.asarray(np.repeat(np.arange(4), L // 4)[None], jnp.int32)  # 4 packed documents
    kw = dict(causal=True, segment_ids=seg)
    spec = P(None, "sp")
    # The ring runs on inputs already dealt to the devices in the layout's order.
    to = lambda x: jax.device_put(ra.layouts.to_layout(x, args.layout, n), NamedSharding(mesh, spec))
    back = lambda x: ra.layouts.from_layout(x, args.layout, n)
    seg_l = to(seg)
    ring_local = jax.shard_map(
        lambda q, k, v, s: ra.ring_attention(
            q, k, v, "sp", causal=True, segment_ids=s, layout=args.layout, implementation="xla"
        ),
        mesh=mesh,
        in_specs=(spec,) * 4,
        out_specs=spec,
    )
    ring = lambda q, k, v: ring_local(q, k, v, seg_l)
    ref = lambda q, k, v: ra.reference_attention(q, k, v, **kw)
    loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v) ** 2)
    ring_g = jax.jit(jax.value_and_grad(loss(ring), argnums=(0, 1, 2)))
    ref_g = jax.jit(jax.value_and_grad(loss(ref), argnums=(0, 1, 2)))
    ql, kl, vl = to(q), to(k), to(v)
    print(
        f"ring attention: L={L} tokens over {n} devices ({args.layout}), H={H} K={K} D={D}, "
        f"causal + 4 packed documents"
    )
    _time_and_memory("ring", ring_g, (ql, kl, vl))
    _time_and_memory("reference", ref_g, (q, k, v))
    (_, gr), (_, gf) = ring_g(ql, kl, vl), ref_g(q, k, v)
    gr = [back(g) for g in gr]
    o, o_ref = back(ring(ql, kl, vl)), ref(q, k, v)
    rel = lambda a, b: float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))  # noqa: E731
    out_err, grad_err = rel(o, o_ref), max(rel(a, b) for a, b in zip(gr, gf))
    print(f"  relative error vs reference: output {out_err:.2e}, gradients {grad_err:.2e}")
    ok = out_err < 1e-5 and grad_err < 1e-5
    print("  OK: exact within float32 rounding" if ok else "  MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
