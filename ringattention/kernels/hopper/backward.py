"""Wrapper of the Pallas Mosaic GPU (Hopper) ring-step backward (``bwd_kernels.py``).

FlashAttention-2/3 backward (Dao 2023; Shah et al. 2024) for one step of Ring Attention (Liu, Zaharia
& Abbeel 2023): a dq kernel over query CTAs and a dk/dv kernel over key CTAs, both recomputing
probabilities from the ring's global lse. Padding and block classification are ``pallas_gpu``'s
(sentinel segment ids, ``masks.block_table`` -> lo/mid/hi). Selected by
``pallas_hopper.BlockSizes(backward="mosaic")``. The optional features of the step contract
(``implementations.py``: softcap, prefix, bidirectional, v's own head dim) are the kernels'
(``bwd_kernels``); here the prefix and bidirectional segments enter the block table, and
v / do are padded to their own head dim.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

from ringattention import masks
from ringattention.kernels import common
from ringattention.kernels.hopper import bwd_common as hbc
from ringattention.kernels.hopper import bwd_kernels as hbk
from ringattention.kernels.hopper import mosaic as hm

F32 = jnp.float32
ROWS = 64  # own rows per compute warpgroup; streamed block length of the dk/dv kernel
CTA = hm.COMPUTE_WGS * ROWS
SMEM_LIMIT = 227 * 1024  # bytes of shared memory one CTA may use on sm_90


def _pad(q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg):
    B, Sq, H, D = q.shape
    Sk, Dv = k.shape[1], v.shape[3]
    up = lambda x, m: -(-x // m) * m  # noqa: E731
    geo = common.Geometry(
        Sq, Sk, D, CTA, CTA, up(Sq, CTA), up(Sk, CTA), up(D, 64), 0 if Dv == D else up(Dv, 64)
    )
    q, k, v, q_pos, k_pos, q_seg, k_seg, do = common.pad_inputs(geo, q, k, v, q_pos, k_pos, q_seg, k_seg, do)
    lse2 = jnp.where(jnp.isneginf(lse), 0.0, lse) * hm.LOG2E  # [B, H, Sq] log2 units
    lse2, delta = (common.pad_to(x, 2, geo.sq_pad) for x in (lse2, delta))
    return q, k, v, do, lse2, delta, q_pos, k_pos, q_seg, k_seg


def _scratch(
    own_len,
    stream_len,
    d,
    dtype,
    stages,
    own_f32: int,
    stream_f32: int,
    positions,
    segments,
    dv: int | None = None,
):
    """Own-side buffers (2 tiles: head dims d, then dv (None: d); 2 int vectors), streamed-side
    buffers, then 3 barriers."""
    tiles = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    wgs = hm.COMPUTE_WGS
    widths = (d, d if dv is None else dv)

    def side(n, length, n_tiles, n_f32):
        bufs = [plgpu.SMEM((n, length, widths[t]), dtype, transforms=tiles) for t in range(n_tiles)]
        bufs += [plgpu.SMEM((n, length), F32) for _ in range(n_f32)]
        bufs += [plgpu.SMEM((n, length), jnp.int32) if on else None for on in (positions, segments)]
        return bufs

    own = side(wgs, own_len, 2, own_f32)
    stream = side(stages, stream_len, 2, stream_f32)
    extra = positions + segments
    return [
        *own,
        *stream,
        plgpu.Barrier(num_arrivals=2 + own_f32 + extra, num_barriers=wgs),  # own rows loaded
        plgpu.Barrier(num_arrivals=2 + stream_f32 + extra, num_barriers=stages),  # slot loaded
        plgpu.Barrier(num_arrivals=wgs, num_barriers=stages),
    ]  # slot free


def _check_smem(bs, dims: tuple[int, int], padded: tuple[int, int], itemsize: int) -> None:
    """ValueError where the dq or the dk/dv kernel would not fit the shared memory (head dims
    ``dims`` of q/k and v, padded to ``padded``)."""
    (D, Dv), (d, d_v), c = dims, padded, bs.bwd_block_k
    tile = (d + d_v) * itemsize  # bytes per row of a [rows, d] and a [rows, dv] tile
    smem = max(
        hm.COMPUTE_WGS * ROWS * tile + bs.bwd_stages * c * tile,  # dq kernel
        (hm.COMPUTE_WGS + bs.bwd_stages) * ROWS * tile,  # dk/dv kernel
    )
    if smem > SMEM_LIMIT - 4096:
        raise ValueError(
            f"pallas_hopper backward='mosaic': head dims {D}, {Dv} (padded {d}, {d_v}) "
            f"with bwd_stages={bs.bwd_stages}, bwd_block_k={c} need {smem} bytes of "
            f"shared memory (limit {SMEM_LIMIT}); use fewer bwd_stages, bwd_block_k=64, "
            "or backward='triton' for head dims above 128"
        )


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
    """float32 dq [B, Sq, H, D], dk [B, Sk, K, D], dv [B, Sk, K, Dv] (contract in
    ``implementations.py``; ``prefix``: int32 [B] or None, checked by the caller)."""
    B, Sq, H, D = q.shape
    Sk, K, Dv = k.shape[1], k.shape[2], v.shape[3]
    q, k, v, do, lse2, delta, q_pos, k_pos, q_seg, k_seg = _pad(
        q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg
    )
    sq, sk, d, d_v = q.shape[1], k.shape[1], q.shape[3], v.shape[3]  # padded
    _check_smem(bs, (D, Dv), (d, d_v), q.dtype.itemsize)
    c = bs.bwd_block_k  # keys per streamed block of the dq kernel
    segments = q_seg is not None
    positions = causal or window is not None
    extra = ((q_pos, k_pos) if positions else ()) + ((q_seg, k_seg) if segments else ())
    args = (q, k, v, do, lse2, delta, *extra)
    last = () if prefix is None else (keep_above_min(prefix),)  # the kernels' last input
    cfg = functools.partial(
        hbc.BwdConfig,
        rows=ROWS,
        stages=bs.bwd_stages,
        registers=bs.registers,
        causal=causal,
        segments=segments,
        groups=H // K,
        qk_scale=softmax_scale * hm.LOG2E,
        scale=softmax_scale,
        interpret=interpret,
        window=window,
        **features(softcap, prefix, bidirectional),
    )
    mask_kw = dict(window=window, prefix=prefix, bidirectional=bidirectional)
    table = functools.partial(masks.block_table, q_pos, k_pos, q_seg, k_seg, causal, **mask_kw)
    # dq: own query CTAs, streamed key blocks of c keys.
    *bounds, edge = common.block_bounds(table(CTA, c), B, window)  # [B|1, nq, nk] -> [B, nq] each
    dq_cfg = cfg(block=c, n_cta=sq // CTA)
    dq = hm.launch(
        functools.partial(hbk.dq_kernel, cfg=dq_cfg),
        jax.ShapeDtypeStruct((B, sq, H, d), F32),
        _scratch(ROWS, c, d, q.dtype, bs.bwd_stages, 2, 0, positions, segments, d_v),
        grid=(H, sq // CTA, B),
        interpret=interpret,
    )(*bounds, *args, *(() if edge is None else (edge,)), *last)
    # dk/dv: own key CTAs, streamed query blocks of every head in the group.
    bounds = hbc.key_cta_bounds(table(ROWS, CTA), B, window)  # reversed query blocks, per key CTA
    kv_cfg = cfg(block=ROWS, n_cta=sk // CTA)
    out = jax.ShapeDtypeStruct((B, sk, K, d), F32)
    out_v = out if d_v == d else jax.ShapeDtypeStruct((B, sk, K, d_v), F32)
    dk, dv = hm.launch(
        functools.partial(hbk.dkv_kernel, cfg=kv_cfg),
        (out, out_v),
        _scratch(ROWS, ROWS, d, q.dtype, bs.bwd_stages, 0, 2, positions, segments, d_v),
        grid=(K, sk // CTA, B),
        interpret=interpret,
    )(*bounds[:3], *args, *bounds[3:], *last)
    return dq[:, :Sq, :, :D], dk[:, :Sk, :, :D], dv[:, :Sk, :, :Dv]


def features(softcap: float | None, prefix, bidirectional: bool) -> dict:
    """``hbc.BwdConfig``'s feature fields (only those in use: the config of a step without
    features is the one it always was)."""
    on = dict(
        softcap=None if softcap is None else float(softcap),
        prefix=prefix is not None,
        bidirectional=bool(bidirectional),
    )
    return {name: x for name, x in on.items() if x}


def keep_above_min(prefix):
    """int32 [B]: the prefix with INT_MIN raised by one (``hbc.causal_rows`` compares with
    ``prefix - 1``; no key position is INT_MIN)."""
    return jnp.maximum(prefix, jnp.int32(hbc.INT_MIN + 1))
