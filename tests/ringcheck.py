"""Shared test harness: float64 numpy reference (forward and gradients) and a ring runner.

Every implementation's tests call :func:`check_ring`, which builds a global problem, deals it to a ring
of ``n`` CPU devices in the chosen layout, runs ``ring_attention`` forward and backward through
``jax.shard_map`` and compares output and dq/dk/dv with the float64 reference on the global sequence.
With ``ulysses=U`` the mesh is ``n x U`` ("sp", "usp"): the sequence in layout order for the ring of
``n`` is split over ("sp", "usp") and ``ring_attention`` runs with ``ulysses_axis="usp"``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from ringattention import layouts, ring_attention

# Relative Frobenius-norm error bounds against the float64 reference.
F32_RTOL = 1e-5
BF16_RTOL = 2e-2
RTOL = {"float32": F32_RTOL, "bfloat16": BF16_RTOL}


def reference64(q, k, v, do, *, causal, seg, scale=None, window=None):
    """Naive attention and its gradients in float64. q [B,L,H,D], k/v [B,L,K,D], seg [B,L] | None,
    window: None or W (key j visible to query i only if |i - j| < W)."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    B, L, H, D = q.shape
    K = k.shape[2]
    G = H // K
    scale = D**-0.5 if scale is None else scale
    kr, vr = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)  # [B, L, H, D]
    s = np.einsum("bqhd,bkhd->bhqk", q, kr) * scale
    mask = np.ones((B, 1, L, L), bool)
    if causal:
        mask &= np.tril(np.ones((L, L), bool))[None, None]
    if seg is not None:
        seg = np.asarray(seg)
        mask &= (seg[:, :, None] == seg[:, None, :])[:, None]
    if window is not None:
        i = np.arange(L)
        mask &= (np.abs(i[:, None] - i[None, :]) < window)[None, None]
    s = np.where(mask, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    p = p / np.where(l > 0, l, 1.0)
    o = np.einsum("bhqk,bkhd->bqhd", p, vr)
    dp = np.einsum("bqhd,bkhd->bhqk", do, vr)
    dv = np.einsum("bhqk,bqhd->bkhd", p, do)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True)) * scale
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kr)
    dk = np.einsum("bhqk,bqhd->bkhd", ds, q)
    fold = lambda x: x.reshape(B, L, K, G, D).sum(3)
    return o, dq, fold(dk), fold(dv)


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


def make_inputs(pb: Problem):
    rng = np.random.default_rng(pb.seed)
    L = pb.n * (pb.ulysses or 1) * pb.shard
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    q = f(pb.batch, L, pb.heads, pb.head_dim) * pb.logit_scale
    k = f(pb.batch, L, pb.kv_heads, pb.head_dim)
    v, do = f(pb.batch, L, pb.kv_heads, pb.head_dim), f(pb.batch, L, pb.heads, pb.head_dim)
    seg = random_segments(rng, pb.batch, L) if pb.segments else None
    cast = lambda x: np.asarray(jnp.asarray(x, pb.dtype).astype(jnp.float32))  # round like inputs
    return cast(q), cast(k), cast(v), cast(do), seg


def run_ring(pb: Problem, q, k, v, do, seg, check_vma: bool | None = None, **kwargs):
    """Runs ring attention forward + backward on global natural-order arrays; returns o, dq, dk, dv.
    ``check_vma``: the shard_map's (None: the one the library's own shard_maps use)."""
    u = pb.ulysses or 1
    mesh = Mesh(np.array(jax.devices()[: pb.n * u]).reshape(pb.n, u), ("sp", "usp"))
    if pb.ulysses is not None:
        kwargs = {**kwargs, "ulysses_axis": "usp"}
    to = lambda x: layouts.to_layout(jnp.asarray(x), pb.layout, pb.n)
    back = lambda x: np.asarray(layouts.from_layout(x, pb.layout, pb.n).astype(jnp.float32))
    dt = jnp.dtype(pb.dtype)
    ql, kl, vl, dol = (to(x).astype(dt) for x in (q, k, v, do))
    segl = None if seg is None else to(seg)
    spec = sspec = P(None, ("sp", "usp"))
    if check_vma is None:
        check_vma = True  # shard_map's default, under which every implementation runs

    def local(q, k, v, do, seg):
        f = lambda q, k, v: ring_attention(q, k, v, "sp", causal=pb.causal, segment_ids=seg,
                                           layout=pb.layout, sliding_window=pb.window, **kwargs)
        o, vjp = jax.vjp(f, q, k, v)
        return (o, *vjp(do))

    fn = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 4 + (sspec,),
                               out_specs=(spec,) * 4, check_vma=check_vma))
    return tuple(back(x) for x in fn(ql, kl, vl, dol, segl))


def check_ring(pb: Problem, rtol: float | None = None, **kwargs) -> list[float]:
    """Asserts output and gradients match the float64 reference within ``rtol``; returns the errors."""
    q, k, v, do, seg = make_inputs(pb)
    got = run_ring(pb, q, k, v, do, seg, **kwargs)
    want = reference64(q, k, v, do, causal=pb.causal, seg=seg, window=pb.window)
    # dq and dk are exactly zero in float64 where every query sees one key (the softmax is constant)
    # and only rounding remains in float32: those are measured on the scale of dv, the gradient that
    # does flow, instead of against zero.
    dv_norm = np.linalg.norm(np.asarray(want[3], np.float64))
    assert all(np.all(np.isfinite(np.asarray(g))) for g in got), "non-finite values in result"
    errs = [rel_err(g, w) if np.any(np.asarray(w)) or i == 3 else
            float(np.linalg.norm(np.asarray(g, np.float64)) / max(dv_norm, 1e-30))
            for i, (g, w) in enumerate(zip(got, want))]
    tol = RTOL[pb.dtype] if rtol is None else rtol
    names = ("o", "dq", "dk", "dv")
    bad = {n: e for n, e in zip(names, errs) if not e <= tol}
    assert not bad, f"{pb}: errors {bad} exceed {tol=}"
    return errs
