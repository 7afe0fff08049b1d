"""Shared test harness: float64 numpy reference (forward and gradients) and a ring runner.

Every implementation's tests call :func:`check_ring`, which builds a global problem, deals it to a ring
of ``n`` CPU devices in the chosen layout, runs ``ring_attention`` forward and backward through
``jax.shard_map`` and compares output and dq/dk/dv with the float64 reference on the global sequence.
With ``ulysses=U`` the mesh is ``n x U`` ("sp", "usp"): the sequence in layout order for the ring of
``n`` is split over ("sp", "usp") and ``ring_attention`` runs with ``ulysses_axis="usp"``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from ringattention import layouts, ring_attention

# Relative Frobenius-norm error bounds against the float64 reference.
F32_RTOL = 1e-5
BF16_RTOL = 2e-2
RTOL = {"float32": F32_RTOL, "bfloat16": BF16_RTOL}


def reference64(
    q,
    k,
    v,
    do,
    *,
    causal,
    seg,
    scale=None,
    window=None,
    sinks=None,
    softcap=None,
    prefix=None,
    bidirectional=False,
):
    """Naive attention and its gradients in float64. q [B,L,H,D], k [B,L,K,D], v [B,L,K,Dv],
    seg [B,L] | None, window: None or W (key j visible to query i only if |i - j| < W); sinks [H]
    (a logit per head in the denominator, no value), softcap C (scores C tanh(s / C)), prefix int [B]
    (with causal: keys j < prefix[b] visible), bidirectional (with causal: negative segment ids see
    their whole segment). Returns o, dq, dk, dv, plus dsinks when sinks are given."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    B, L, H, D = q.shape
    K = k.shape[2]
    G = H // K
    scale = D**-0.5 if scale is None else scale
    kr, vr = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)  # [B, L, H, D | Dv]
    s = np.einsum("bqhd,bkhd->bhqk", q, kr) * scale
    if softcap is not None:
        t = np.tanh(s / softcap)
        s = softcap * t
    i = np.arange(L)
    mask = np.ones((B, 1, L, L), bool)
    if causal:
        before = np.broadcast_to((i[None, :] <= i[:, None])[None, None], (B, 1, L, L))
        if prefix is not None:
            before = before | (i[None, None, None, :] < np.asarray(prefix)[:, None, None, None])
        if bidirectional:
            before = before | (np.asarray(seg) < 0)[:, None, :, None]
        mask &= before
    if seg is not None:
        seg = np.asarray(seg)
        mask &= (seg[:, :, None] == seg[:, None, :])[:, None]
    if window is not None:
        mask &= (np.abs(i[:, None] - i[None, :]) < window)[None, None]
    s = np.where(mask, s, -np.inf)
    m = s.max(-1, keepdims=True)
    sink = None if sinks is None else np.asarray(sinks, np.float64)[None, :, None, None]
    if sink is not None:
        m = np.maximum(m, sink)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True) + (0.0 if sink is None else np.exp(sink - m))
    l = np.where(l > 0, l, 1.0)
    p = p / l
    o = np.einsum("bhqk,bkhd->bqhd", p, vr)
    dp = np.einsum("bqhd,bkhd->bhqk", do, vr)
    dv = np.einsum("bhqk,bqhd->bkhd", p, do)
    delta = np.einsum("bqhd,bqhd->bhq", o, do)[..., None]  # rowsum(o * do) = sum_j p dp
    ds = p * (dp - delta) * scale
    if softcap is not None:
        ds = ds * (1.0 - t**2)
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kr)
    dk = np.einsum("bhqk,bqhd->bkhd", ds, q)
    fold = lambda x: x.reshape(B, L, K, G, x.shape[-1]).sum(3)
    out = (o, dq, fold(dk), fold(dv))
    if sink is None:
        return out
    dsinks = -(np.exp(sink - m) / l * delta).sum((0, 2, 3))  # [H]
    return (*out, dsinks)


def rel_err(x, ref) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(x)), "non-finite values in result"
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))


def random_segments(rng, batch: int, length: int, max_docs: int = 4) -> np.ndarray:
    """Packed-document ids with boundaries anywhere (not aligned to shards or chunks). int32 [B, L]."""
    out = np.zeros((batch, length), np.int32)
    for b in range(batch):
        cuts = np.sort(rng.choice(np.arange(1, length), size=max_docs - 1, replace=False))
        out[b] = np.searchsorted(cuts, np.arange(length), side="right")
    return out


@dataclasses.dataclass(frozen=True)
class Problem:
    n: int = 4
    layout: str = "contiguous"
    causal: bool = True
    segments: bool = False
    batch: int = 2
    shard: int = 16
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    dtype: str = "float32"
    logit_scale: float = 1.0
    seed: int = 0
    ulysses: int | None = None  # Ulysses group size U (``shard``: each device's piece of a ring shard)
    window: int | None = None  # sliding window (None: none)
    sinks: bool = False  # random attention sinks [heads] (differentiated)
    softcap: float | None = None  # logits_soft_cap
    prefix: bool = False  # random prefix_length [batch] in [0, L] (needs causal)
    bidirectional: bool = False  # odd segment ids become negative: bidirectional (needs segments)
    v_head_dim: int | None = None  # v's head dim (None: head_dim)
    strategy: str = "ring"  # ring_attention's strategy over "sp" (ringattention.strategy)


def make_inputs(pb: Problem):
    rng = np.random.default_rng(pb.seed)
    L = pb.n * (pb.ulysses or 1) * pb.shard
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    q = f(pb.batch, L, pb.heads, pb.head_dim) * pb.logit_scale
    k = f(pb.batch, L, pb.kv_heads, pb.head_dim)
    dv = pb.v_head_dim or pb.head_dim
    v, do = f(pb.batch, L, pb.kv_heads, dv), f(pb.batch, L, pb.heads, dv)
    seg = random_segments(rng, pb.batch, L) if pb.segments else None
    if seg is not None and pb.bidirectional:  # ids 1, 3: bidirectional segments -1, -3
        seg = np.where(seg % 2 == 1, -seg, seg).astype(np.int32)
    cast = lambda x: np.asarray(jnp.asarray(x, pb.dtype).astype(jnp.float32))  # round like inputs
    return cast(q), cast(k), cast(v), cast(do), seg


def make_extras(pb: Problem) -> dict:
    """The feature arguments of ``pb`` for both ``ring_attention`` and :func:`reference64` (random
    sinks and prefix lengths from their own stream, so ``make_inputs`` stays as it was)."""
    rng = np.random.default_rng(pb.seed + 1000)
    L = pb.n * (pb.ulysses or 1) * pb.shard
    out = {}
    if pb.sinks:
        out["sinks"] = rng.standard_normal(pb.heads).astype(np.float32)
    if pb.prefix:  # one row without a prefix, one with the whole sequence, the rest anywhere
        lengths = rng.integers(1, L, pb.batch)
        lengths[0] = 0
        if pb.batch > 2:
            lengths[-1] = L
        out["prefix"] = lengths.astype(np.int32)
    return out


def run_ring(pb: Problem, q, k, v, do, seg, check_vma: bool | None = None, extras=None, **kwargs):
    """Runs ring attention forward + backward on global natural-order arrays; returns o, dq, dk, dv
    (and dsinks with ``extras["sinks"]``). ``check_vma``: the shard_map's (None: the one the
    library's own shard_maps use). ``extras``: :func:`make_extras`' dict (None: made from ``pb``)."""
    extras = make_extras(pb) if extras is None else extras
    u = pb.ulysses or 1
    axes = ("sp", "usp")
    mesh = Mesh(np.array(jax.devices()[: pb.n * u]).reshape(pb.n, u), axes)
    if pb.ulysses is not None:
        kwargs = {**kwargs, "ulysses_axis": "usp"}
    kwargs.update(logits_soft_cap=pb.softcap, bidirectional_segments=pb.bidirectional)
    to = lambda x: layouts.to_layout(jnp.asarray(x), pb.layout, pb.n)
    back = lambda x: np.asarray(layouts.from_layout(x, pb.layout, pb.n).astype(jnp.float32))
    dt = jnp.dtype(pb.dtype)
    ql, kl, vl, dol = (to(x).astype(dt) for x in (q, k, v, do))
    segl = None if seg is None else to(seg)
    spec = sspec = P(None, axes)
    if check_vma is None:
        check_vma = True  # shard_map's default, under which every implementation runs
    sinks = extras.get("sinks")
    sinks = None if sinks is None else jnp.asarray(sinks)
    prefix = extras.get("prefix")
    prefix = None if prefix is None else jnp.asarray(prefix)

    def local(q, k, v, do, seg, sinks, prefix):
        f = lambda q, k, v, snk: ring_attention(
            q,
            k,
            v,
            "sp",
            causal=pb.causal,
            segment_ids=seg,
            layout=pb.layout,
            sliding_window=pb.window,
            sinks=snk,
            prefix_length=prefix,
            strategy=pb.strategy,
            **kwargs,
        )
        o, vjp = jax.vjp(f, q, k, v, sinks)
        dq, dk, dv, ds = vjp(do)
        if ds is not None and not check_vma:  # per device: sum over the mesh (check_vma does it)
            ds = jax.lax.psum(ds, axes)
        return o, dq, dk, dv, ds

    fn = jax.jit(
        jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(spec,) * 4 + (sspec, P(), P()),
            out_specs=(spec,) * 4 + (P(),),
            check_vma=check_vma,
        )
    )
    *main, ds = fn(ql, kl, vl, dol, segl, sinks, prefix)
    out = tuple(back(x) for x in main)
    return out if ds is None else (*out, np.asarray(ds, np.float32))


def check_ring(pb: Problem, rtol: float | None = None, **kwargs) -> list[float]:
    """Asserts output and gradients (and dsinks) match the float64 reference within ``rtol``;
    returns the errors."""
    q, k, v, do, seg = make_inputs(pb)
    extras = make_extras(pb)
    got = run_ring(pb, q, k, v, do, seg, extras=extras, **kwargs)
    want = reference64(
        q,
        k,
        v,
        do,
        causal=pb.causal,
        seg=seg,
        window=pb.window,
        sinks=extras.get("sinks"),
        softcap=pb.softcap,
        prefix=extras.get("prefix"),
        bidirectional=pb.bidirectional,
    )
    # dq and dk are exactly zero in float64 where every query sees one key (the softmax is constant)
    # and only rounding remains in float32: those are measured on the scale of dv, the gradient that
    # does flow, instead of against zero.
    dv_norm = np.linalg.norm(np.asarray(want[3], np.float64))
    assert all(np.all(np.isfinite(np.asarray(g))) for g in got), "non-finite values in result"
    errs = [
        rel_err(g, w)
        if np.any(np.asarray(w)) or i == 3
        else float(np.linalg.norm(np.asarray(g, np.float64)) / max(dv_norm, 1e-30))
        for i, (g, w) in enumerate(zip(got, want))
    ]
    tol = RTOL[pb.dtype] if rtol is None else rtol
    names = ("o", "dq", "dk", "dv", "dsinks")
    bad = {n: e for n, e in zip(names, errs) if not e <= tol}
    assert not bad, f"{pb}: errors {bad} exceed {tol=}"
    return errs


def tpu_devices(topology: str = "v5e:2x2"):
    """The TPU devices of a named slice that this CPU host compiles for (the TPU compiler, libtpu);
    skips, printing why, where no libtpu matching the installed jax is installed."""
    try:
        from jax.experimental import topologies

        return topologies.get_topology_desc(topology_name=topology, platform="tpu").devices
    except Exception as e:  # noqa: BLE001  no TPU plugin: ImportError, RuntimeError, ...
        reason = f"no libtpu for jax {jax.__version__} here ({type(e).__name__}: {e})"
        print(reason)
        pytest.skip(reason)


@functools.cache
def _h200_topology(n: int):
    import importlib.util
    import os
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "tools" / "hopper_aot.py"
    spec = importlib.util.spec_from_file_location("hopper_aot", path)
    hopper_aot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hopper_aot)
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")  # no CUDA runtime to check
    from jax._src import xla_bridge
    from jax.experimental import topologies

    xla_bridge._discover_and_register_pjrt_plugins()
    return topologies.get_topology_desc(
        platform="cuda", topology=f"1x1x{n}", target_config=hopper_aot.H200_TARGET_CONFIG
    ).devices


def h200_devices(n: int = 1):
    """``n`` H200s of one host for XLA's deviceless GPU compile (a topology plus the device
    description an H200 reports, ``tools/hopper_aot.py``): this CPU host lowers and compiles CUDA
    programs for them, Mosaic GPU and Triton kernels included, and runs nothing. Skips, printing
    why, where jax's CUDA plugin (``jax-cuda13-plugin``, which ``make test`` installs) is missing."""
    try:
        return _h200_topology(n)
    except Exception as e:  # noqa: BLE001  no CUDA plugin: ImportError, RuntimeError, ...
        reason = f"no CUDA plugin for jax {jax.__version__} here ({type(e).__name__}: {e})"
        print(reason)
        pytest.skip(reason)


def on_device(device, *structs):
    """``structs`` (ShapeDtypeStructs or None) placed on ``device``: a jitted function traced with
    them lowers for that device's platform."""
    sharding = jax.sharding.SingleDeviceSharding(device)
    return tuple(
        None if s is None else jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) for s in structs
    )


@contextlib.contextmanager
def mosaic_modules():
    """Yields a list that collects the MLIR text of every Mosaic GPU kernel lowered inside the block
    (each passes through Mosaic GPU's serialization pass first); skips the test where this jax's
    lowering has no such pass to read kernels from."""
    from jax.experimental.mosaic.gpu import core as mgc

    if not hasattr(mgc, "_run_serde_pass"):
        pytest.skip("this jax's Mosaic GPU lowering has no _run_serde_pass to read kernels from")
    texts, serde = [], mgc._run_serde_pass

    def capture(module, **kw):
        texts.append(str(module))
        return serde(module, **kw)

    with mock.patch.object(mgc, "_run_serde_pass", capture):
        yield texts
