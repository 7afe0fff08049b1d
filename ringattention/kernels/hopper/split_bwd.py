"""Wrapper of the Pallas Mosaic GPU (Hopper) ring-step backward above head dim 128 (``split_kernels.py``).

The FlashAttention-3 backward (Shah et al. 2024; its head-dim-256 configuration) for one step of Ring
Attention (Liu, Zaharia & Abbeel 2023): ``split_kernels.dq_kernel`` over query CTAs, then
``split_kernels.split_kernel`` (dk, dv) over key CTAs, each CTA's two compute warpgroups splitting
the head dim. Here: the head dims padded (``padded_dims``: q/k and v each to a multiple of 64 where
v has its own head dim, 192 staying 192; both to 256 otherwise, as timed on the device), the shared
memory checked against the device's before tracing (``split_kernels.smem_bytes``), the block table
and bounds (``masks.block_table``; the key CTAs' over the reversed query blocks) and the launches.
Selected by ``pallas_hopper.BlockSizes(backward="mosaic")`` where the larger head dim is 129-256.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from ringattention import masks
from ringattention.kernels import common
from ringattention.kernels.hopper import backward as hb
from ringattention.kernels.hopper import bwd_common as hbc
from ringattention.kernels.hopper import mosaic as hm
from ringattention.kernels.hopper import split_kernels as hsk
from ringattention.kernels.hopper.split_kernels import F32, ROWS, D, smem_bytes


def padded_dims(Dh: int, Dv: int) -> tuple[int, int]:
    """The padded head dims of q/k and of v: 256 both without a head dim of v's own (the kernels
    timed on the device, docs/kernels.md); with one, each a multiple of 64 (module docstring)."""
    if Dh == Dv:
        return D, D
    return -(-Dh // 64) * 64, -(-Dv // 64) * 64


def _check_smem(bs, dtype, positions: bool, segments: bool, dims, padded) -> None:
    """ValueError where the kernels' buffers (``smem_bytes``: the dk/dv kernel's, at least the dq
    kernel's) would not fit the shared memory; ``dims``, ``padded``: the head dims of q/k and v."""
    (Dh, Dv), (d, d_v) = dims, padded
    smem = smem_bytes(dtype, bs.bwd_stages, positions, segments, d, d_v)
    if smem > hb.SMEM_LIMIT - 4096:
        raise ValueError(
            f"pallas_hopper backward={bs.backward!r}: head dims {Dh}, {Dv} (padded {d}, "
            f"{d_v}) with bwd_stages={bs.bwd_stages} need {smem} bytes of shared memory "
            f"(limit {hb.SMEM_LIMIT}); use bwd_stages=2 or backward='triton'"
        )


@functools.partial(jax.jit, static_argnames=("cfg",))
def _run_two(q_bounds, k_bounds, last, q, k, v, do, lse2, delta, *extra, cfg: hbc.BwdConfig):
    """dq f32 [B, H, Sq, D] (scaled) from ``dq_kernel``, then dk f32 [B, K, Sk, D], dv
    [B, K, Sk, Dv] from ``split_kernel``. q_bounds / k_bounds: lo, mid, hi (and a window's edge)
    over the key blocks / the reversed query blocks; ``last``: (the prefix,) or (), each kernel's
    last input."""
    B, sq, H, d = q.shape
    sk, K, d_v = k.shape[1], k.shape[2], v.shape[3]
    args = (q, k, v, do, lse2, delta, *extra)
    dq_cfg = dataclasses.replace(cfg, n_cta=sq // ROWS)
    dq = hm.launch(
        functools.partial(hsk.dq_kernel, cfg=dq_cfg),
        jax.ShapeDtypeStruct((B, H, sq, d), F32),
        hsk.dq_scratch(q.dtype, cfg.stages, cfg.positions, cfg.segments, d, d_v),
        grid=(H, sq // ROWS, B),
        interpret=cfg.interpret,
    )(*q_bounds[:3], *args, *q_bounds[3:], *last)
    out = jax.ShapeDtypeStruct((B, K, sk, d), F32)
    out_v = out if d_v == d else jax.ShapeDtypeStruct((B, K, sk, d_v), F32)
    dk, dv = hm.launch(
        functools.partial(hsk.split_kernel, cfg=cfg),
        (out, out_v),
        hsk.dkv_scratch(q.dtype, cfg.stages, cfg.positions, cfg.segments, d, d_v),
        grid=(K, sk // ROWS, B),
        interpret=cfg.interpret,
    )(*k_bounds[:3], *args, *k_bounds[3:], *last)
    return dq, dk, dv


def backward(
    q,
    k,
    v,
    do,
    lse,
    delta,
    q_pos,
    k_pos,
    q_seg,
    k_seg,
    *,
    bs,
    causal: bool,
    softmax_scale: float,
    interpret: bool,
    window: int | None = None,
    softcap: float | None = None,
    prefix=None,
    bidirectional: bool = False,
):
    """float32 dq [B, Sq, H, Dh], dk [B, Sk, K, Dh], dv [B, Sk, K, Dv] where the larger head dim is
    129-256 (``padded_dims``; contract in ``implementations.py``, optional features as
    ``backward.backward``'s): ``dq_kernel`` and ``split_kernel``."""
    B, Sq, H, Dh = q.shape
    Sk, K, Dv = k.shape[1], k.shape[2], v.shape[3]
    if not (128 < max(Dh, Dv) <= D and min(Dh, Dv) >= 1):
        raise ValueError(
            f"split_bwd: head dims {Dh}, {Dv} ({q.shape=} {v.shape=}): the larger must be in (128, {D}]"
        )
    d, d_v = padded_dims(Dh, Dv)
    positions = causal or window is not None
    _check_smem(bs, q.dtype, positions, q_seg is not None, (Dh, Dv), (d, d_v))
    up = lambda x: -(-x // ROWS) * ROWS  # noqa: E731
    geo = common.Geometry(Sq, Sk, Dh, ROWS, ROWS, up(Sq), up(Sk), d, 0 if d_v == d else d_v)
    q, k, v, q_pos, k_pos, q_seg, k_seg, do = common.pad_inputs(geo, q, k, v, q_pos, k_pos, q_seg, k_seg, do)
    lse2 = jnp.where(jnp.isneginf(lse), 0.0, lse) * hm.LOG2E  # [B, H, Sq] log2 units
    lse2, delta = (common.pad_to(x, 2, geo.sq_pad) for x in (lse2, delta))
    segments = q_seg is not None
    extra = ((q_pos, k_pos) if positions else ()) + ((q_seg, k_seg) if segments else ())
    cfg = hbc.BwdConfig(
        rows=ROWS,
        block=ROWS,
        stages=bs.bwd_stages,
        registers=bs.registers,
        causal=causal,
        segments=segments,
        groups=H // K,
        n_cta=geo.sk_pad // ROWS,
        qk_scale=softmax_scale * hm.LOG2E,
        scale=softmax_scale,
        interpret=interpret,
        window=window,
        **hb.features(softcap, prefix, bidirectional),
    )
    table = masks.block_table(
        q_pos, k_pos, q_seg, k_seg, causal, ROWS, ROWS, window, prefix=prefix, bidirectional=bidirectional
    )
    bounds = hbc.key_cta_bounds(table, B, window)  # over the reversed query blocks, per key CTA
    q_bounds = common.bounds(table, B) if window is None else common.edge_bounds(table, B)  # key blocks
    last = () if prefix is None else (hb.keep_above_min(prefix),)
    dq, dk, dv = _run_two(q_bounds, bounds, last, q, k, v, do, lse2, delta, *extra, cfg=cfg)
    cut = lambda x, n, w: jnp.swapaxes(x, 1, 2)[:, :n, :, :w]  # noqa: E731
    return cut(dq, Sq, Dh), cut(dk, Sk, Dh), cut(dv, Sk, Dv)
