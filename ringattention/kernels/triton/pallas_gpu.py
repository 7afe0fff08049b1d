"""Pallas GPU (Triton backend) kernels for one ring step, forward and backward.

The fused inner loop of Ring Attention (Liu, Zaharia & Abbeel 2023) on NVIDIA GPUs (written for
Ampere and Hopper; measured on an H200), tiled like FlashAttention-2 (Dao 2023): one program per
(query block, batch, query head) streams the held key/value shard through on-chip memory with a
float32 online softmax; the backward pass runs a dq kernel (per query block) and a dk/dv kernel
(per key block and kv head, summing the group's query heads, so GQA never repeats k/v in memory),
both recomputing probabilities from the ring's global lse.

Masks come from the global positions of the step (any layout: contiguous, striped, zigzag) and
segment ids. The wrapper classifies block pairs with ``masks.block_table`` and hands every program
the bounds of its fully visible and partially visible blocks; hidden blocks are skipped, fully
visible ones run without the elementwise mask. A sliding window (``|q_pos - k_pos| < window``) adds
the blocks at the window's far edge as a masked range before the fully visible ones. Shards that
are not a multiple of the block are padded with keys that no query sees (sentinel segment ids) and
the padding is cut off again; head dims are padded to a power of two >= 16 (q/k's and v's
separately where v has its own). Contract: ``ringattention/implementations.py``, with its optional
features softcap, prefix, bidirectional and v_head_dim (each off by default: the kernels are then
lowered as without them). Kernel bodies: ``kernels.py``; padding, sentinels, bounds and checks,
shared with the Hopper step and free of Triton: ``ringattention/kernels/common.py``; the float32
reference steps the kernels are tested against: ``ringattention/kernels/reference.py``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ringattention import masks
from ringattention._vma import struct
from ringattention.kernels import common
from ringattention.kernels.reference import (  # noqa: F401  (the tests' name)
    reference_backward_step,
    reference_forward_step,
)
from ringattention.kernels.triton import kernels as kern

F32 = jnp.float32
SQ = pl.squeezed
MIN_BLOCK = 16  # Triton's smallest matmul tile


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes and Triton launch parameters (all block lengths powers of two >= 16).

    ``block_q``/``block_k``: forward; ``*_dq``: the dq kernel; ``*_dkv``: the dk/dv kernel.
    Blocks are clamped to the shard. Defaults: :func:`default_block_sizes` (tuned on an H200 per
    head dim, benchmarks/results/pallas_gpu_h200_notes.md); fields not given take the head-dim-128
    values.
    """

    block_q: int = 128
    block_k: int = 64
    fwd_warps: int = 8
    fwd_stages: int = 3
    block_q_dq: int = 128
    block_k_dq: int = 64
    block_q_dkv: int = 64
    block_k_dkv: int = 128
    bwd_warps: int = 8
    bwd_stages: int = 3

    def __post_init__(self):
        for f in dataclasses.fields(self):
            x = getattr(self, f.name)
            if not isinstance(x, int) or x < 1:
                raise ValueError(f"BlockSizes.{f.name}={x!r} must be a positive int")
            if f.name.startswith("block") and (x < MIN_BLOCK or x & (x - 1)):
                raise ValueError(f"BlockSizes.{f.name}={x} must be a power of two >= {MIN_BLOCK}")


_DEFAULTS = {  # H200 sweeps, bf16: benchmarks/results/pallas_gpu_h200_notes.md (D=64 forward block:
    # pallas_gpu_sweep_h200.md's d64_gqa section, 32K tokens, H=32/K=8, the 1B model's shape)
    64: BlockSizes(
        block_q=128,
        block_k=128,
        fwd_warps=4,
        fwd_stages=3,
        block_q_dq=64,
        block_k_dq=64,
        block_q_dkv=64,
        block_k_dkv=64,
        bwd_warps=4,
        bwd_stages=3,
    ),
    128: BlockSizes(),
    256: BlockSizes(
        block_q=64,
        block_k=32,
        fwd_warps=4,
        fwd_stages=2,
        block_q_dq=64,  # untuned
        block_k_dq=32,
        block_q_dkv=32,
        block_k_dkv=64,
        bwd_warps=4,
        bwd_stages=1,
    ),
}


# 4-byte inputs (float32) double every tile: at head dim 128 the dq kernel's 3 stages ask for 289 KB
# of shared memory, over an H100/H200's 227 KB (a compile error on the device and in the deviceless
# H200 compile of tests/test_gpu_aot.py); 2 stages fit. Untimed: float32 is a correctness path.
_WIDE_DTYPE_FIELDS = {128: dict(bwd_stages=2)}


def default_block_sizes(head_dim: int, dtype=jnp.bfloat16) -> BlockSizes:
    """Tuned defaults for the (padded) head dim: 64, 128 or 256 (smaller dims use the 64 row), with
    fewer pipeline stages where 4-byte ``dtype`` tiles would not fit shared memory."""
    d = min((d for d in _DEFAULTS if d >= head_dim), default=256)
    if jnp.dtype(dtype).itemsize > 2 and d in _WIDE_DTYPE_FIELDS:
        return dataclasses.replace(_DEFAULTS[d], **_WIDE_DTYPE_FIELDS[d])
    return _DEFAULTS[d]


def _next_pow2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def _block(length: int, request: int) -> int:
    """Largest power-of-two block <= request dividing ``length``; else the padded-tail block."""
    b = max(MIN_BLOCK, min(request, _next_pow2(length)))
    while length % b and b > MIN_BLOCK:
        b //= 2
    return b


def _geometry(q, k, bq_req: int, bk_req: int, v=None) -> common.Geometry:
    sq, sk, d = q.shape[1], k.shape[1], q.shape[3]
    bq, bk = _block(sq, bq_req), _block(sk, bk_req)
    dv = d if v is None else v.shape[3]
    return common.Geometry(
        sq,
        sk,
        d,
        bq,
        bk,
        -(-sq // bq) * bq,
        -(-sk // bk) * bk,
        max(MIN_BLOCK, _next_pow2(d)),
        0 if dv == d else max(MIN_BLOCK, _next_pow2(dv)),
    )


def _precision(dtype):
    return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def _params(warps: int, stages: int):
    return plgpu.CompilerParams(num_warps=warps, num_stages=stages)


@dataclasses.dataclass(frozen=True)
class _Mask:
    """Static mask and logit options of one step: the kernels' keywords (all but ``causal`` off
    by default, when the kernels are those without them)."""

    causal: bool
    window: int | None = None
    softcap: float | None = None
    bidirectional: bool = False

    @property
    def pos(self) -> bool:  # the kernels read positions
        return self.causal or self.window is not None

    def table(self, q_pos, k_pos, q_seg, k_seg, bq: int, bk: int, prefix):
        """``masks.block_table`` of the padded step: int32 [B|1, nq, nk]."""
        return masks.block_table(
            q_pos,
            k_pos,
            q_seg,
            k_seg,
            self.causal,
            bq,
            bk,
            self.window,
            prefix=prefix,
            bidirectional=self.bidirectional,
        )


def forward_step(
    q,
    k,
    v,
    q_pos,
    k_pos,
    q_seg,
    k_seg,
    *,
    causal: bool,
    softmax_scale: float,
    block_sizes: BlockSizes | None = None,
    interpret: bool = False,
    window: int | None = None,
    softcap: float | None = None,
    prefix=None,
    bidirectional: bool = False,
):
    """One ring step forward (contract in ``implementations.py``, with the optional features
    softcap, prefix, bidirectional and v_head_dim). Returns (o f32, lse f32)."""
    common.check(q, k, v, q_pos, k_pos, q_seg, k_seg, own_v_dim=True)
    prefix = common.features(q, q_seg, causal, softcap, prefix, bidirectional)
    mask = _Mask(causal, window, None if softcap is None else float(softcap), bidirectional)
    bs = block_sizes or default_block_sizes(max(q.shape[3], v.shape[3]), q.dtype)
    B, Sq, H, D = q.shape
    Dv = v.shape[3]
    geo = _geometry(q, k, bs.block_q, bs.block_k, v)
    q, k, v, q_pos, k_pos, q_seg, k_seg = common.pad_inputs(geo, q, k, v, q_pos, k_pos, q_seg, k_seg)
    table = mask.table(q_pos, k_pos, q_seg, k_seg, geo.bq, geo.bk, prefix)  # [B|1, nq, nk]
    o, lse = _fwd_call(
        common.block_bounds(table, B, window),
        q,
        k,
        v,
        q_pos if mask.pos else None,
        k_pos if mask.pos else None,
        q_seg,
        k_seg,
        prefix,
        geo=geo,
        scale=softmax_scale,
        bs=bs,
        interpret=interpret,
        mask=mask,
    )
    return o[:, :Sq, :, :Dv], lse[:, :, :Sq]


def _fwd_call(bounds, q, k, v, q_pos, k_pos, q_seg, k_seg, prefix, *, geo, scale, bs, interpret, mask: _Mask):
    B, Sq, H, D = q.shape  # padded: [batch, q_shard, heads, head_dim]
    Sk, K, Dv = k.shape[1], k.shape[2], v.shape[3]  # k [B, Sk, K, D], v [B, Sk, K, Dv]
    G, nq, bq = H // K, Sq // geo.bq, geo.bq
    qi = (lambda i: nq - 1 - i) if q_pos is not None else (lambda i: i)  # heavy causal rows first
    scalar = pl.BlockSpec((SQ, SQ), lambda i, b, h: (b, qi(i)))
    kv_spec = lambda d: pl.BlockSpec((SQ, Sk, SQ, d), lambda i, b, h: (b, 0, h // G, 0))  # noqa: E731
    in_specs = [
        scalar,
        scalar,
        scalar,
        None if mask.window is None else scalar,
        pl.BlockSpec((SQ, bq, SQ, D), lambda i, b, h: (b, qi(i), h, 0)),
        kv_spec(D),
        kv_spec(Dv),
        None if q_pos is None else pl.BlockSpec((bq,), lambda i, b, h: (qi(i),)),
        None if k_pos is None else pl.BlockSpec((Sk,), lambda i, b, h: (0,)),
        None if q_seg is None else pl.BlockSpec((SQ, bq), lambda i, b, h: (b, qi(i))),
        None if k_seg is None else pl.BlockSpec((SQ, Sk), lambda i, b, h: (b, 0)),
        None if prefix is None else pl.BlockSpec((SQ,), lambda i, b, h: (b,)),
    ]
    out_specs = [
        pl.BlockSpec((SQ, bq, SQ, Dv), lambda i, b, h: (b, qi(i), h, 0)),
        pl.BlockSpec((SQ, SQ, bq), lambda i, b, h: (b, h, qi(i))),
    ]
    like = (q, k, v, q_seg, k_seg, prefix)  # outputs vary like the inputs (shard_map's check_vma)
    out_shape = [struct((B, Sq, H, Dv), F32, *like), struct((B, H, Sq), F32, *like)]
    kernel = functools.partial(
        kern.fwd_kernel,
        qk_scale=scale * kern.LOG2E,
        block_k=geo.bk,
        precision=_precision(q.dtype),
        **dataclasses.asdict(mask),
    )
    return pl.pallas_call(
        kernel,
        grid=(nq, B, H),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=_params(bs.fwd_warps, bs.fwd_stages),
        interpret=interpret,
        name="ring_step_fwd",
    )(*bounds, q, k, v, q_pos, k_pos, q_seg, k_seg, prefix)


def backward_step(
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
    causal: bool,
    softmax_scale: float,
    block_sizes: BlockSizes | None = None,
    interpret: bool = False,
    window: int | None = None,
    softcap: float | None = None,
    prefix=None,
    bidirectional: bool = False,
):
    """One ring step backward (contract in ``implementations.py``, optional features as in
    :func:`forward_step`). Returns float32 dq, dk, dv."""
    common.check(q, k, v, q_pos, k_pos, q_seg, k_seg, own_v_dim=True)
    B, Sq, H, D = q.shape
    Sk, Dv = k.shape[1], v.shape[3]
    if do.shape != (B, Sq, H, Dv) or lse.shape != delta.shape or lse.shape != (B, H, Sq):
        raise ValueError(f"pallas_gpu: {do.shape=} {lse.shape=} {delta.shape=} for {q.shape=}")
    prefix = common.features(q, q_seg, causal, softcap, prefix, bidirectional)
    bs = block_sizes or default_block_sizes(max(D, Dv), q.dtype)
    lse2 = jnp.where(jnp.isneginf(lse), 0.0, lse) * kern.LOG2E  # [B, H, Sq] log2 units
    mask = _Mask(causal, window, None if softcap is None else float(softcap), bidirectional)
    kw = dict(scale=softmax_scale, bs=bs, interpret=interpret, mask=mask, prefix=prefix)
    geo = _geometry(q, k, bs.block_q_dq, bs.block_k_dq, v)
    args = common.pad_inputs(geo, q, k, v, q_pos, k_pos, q_seg, k_seg, do)
    rows = lambda geo: [common.pad_to(x, 2, geo.sq_pad) for x in (lse2, delta)]  # noqa: E731
    dq = _dq_call(geo, *args, *rows(geo), **kw)
    geo = _geometry(q, k, bs.block_q_dkv, bs.block_k_dkv, v)
    args = common.pad_inputs(geo, q, k, v, q_pos, k_pos, q_seg, k_seg, do)
    dk, dv = _dkv_call(geo, *args, *rows(geo), **kw)
    return dq[:, :Sq, :, :D], dk[:, :Sk, :, :D], dv[:, :Sk, :, :Dv]


def _positions(mask: _Mask, q_pos, k_pos) -> tuple:
    """The kernels' position inputs: (q_pos, k_pos) where the mask compares positions, else Nones."""
    return (q_pos, k_pos) if mask.pos else (None, None)


def _dq_specs(mask: _Mask, dims, q_seg, k_seg, prefix):
    """In and out BlockSpecs of the dq kernel (grid (nq, B, H); causal: the latest query blocks
    first). dims: Sk, G, bq, nq, D, Dv."""
    Sk, G, bq, nq, D, Dv = dims
    qi = (lambda i: nq - 1 - i) if mask.causal else (lambda i: i)
    scalar = pl.BlockSpec((SQ, SQ), lambda i, b, h: (b, qi(i)))
    q_spec = lambda d: pl.BlockSpec((SQ, bq, SQ, d), lambda i, b, h: (b, qi(i), h, 0))  # noqa: E731
    kv_spec = lambda d: pl.BlockSpec((SQ, Sk, SQ, d), lambda i, b, h: (b, 0, h // G, 0))  # noqa: E731
    row_spec = pl.BlockSpec((SQ, SQ, bq), lambda i, b, h: (b, h, qi(i)))
    in_specs = [
        scalar,
        scalar,
        scalar,
        None if mask.window is None else scalar,
        q_spec(D),
        kv_spec(D),
        kv_spec(Dv),
        q_spec(Dv),
        row_spec,
        row_spec,
        pl.BlockSpec((bq,), lambda i, b, h: (qi(i),)) if mask.pos else None,
        pl.BlockSpec((Sk,), lambda i, b, h: (0,)) if mask.pos else None,
        None if q_seg is None else pl.BlockSpec((SQ, bq), lambda i, b, h: (b, qi(i))),
        None if k_seg is None else pl.BlockSpec((SQ, Sk), lambda i, b, h: (b, 0)),
        None if prefix is None else pl.BlockSpec((SQ,), lambda i, b, h: (b,)),
    ]
    return in_specs, q_spec(D)


def _dq_call(
    geo,
    q,
    k,
    v,
    q_pos,
    k_pos,
    q_seg,
    k_seg,
    do,
    lse2,
    delta,
    *,
    scale,
    bs,
    interpret,
    mask: _Mask,
    prefix=None,
):
    B, Sq, H, D = q.shape  # padded
    Sk, K, Dv = k.shape[1], k.shape[2], v.shape[3]
    nq, bq = Sq // geo.bq, geo.bq
    table = mask.table(q_pos, k_pos, q_seg, k_seg, bq, geo.bk, prefix)  # [B|1, nq, nk]
    in_specs, out_spec = _dq_specs(mask, (Sk, H // K, bq, nq, D, Dv), q_seg, k_seg, prefix)
    kernel = functools.partial(
        kern.dq_kernel,
        qk_scale=scale * kern.LOG2E,
        scale=scale,
        block_k=geo.bk,
        precision=_precision(q.dtype),
        **dataclasses.asdict(mask),
    )
    return pl.pallas_call(
        kernel,
        grid=(nq, B, H),
        in_specs=in_specs,
        out_specs=out_spec,
        out_shape=struct((B, Sq, H, D), F32, q, k, v, do, q_seg, k_seg, prefix),
        compiler_params=_params(bs.bwd_warps, bs.bwd_stages),
        interpret=interpret,
        name="ring_step_dq",
    )(
        *common.block_bounds(table, B, mask.window),
        *(q, k, v, do, lse2, delta),
        *(*_positions(mask, q_pos, k_pos), q_seg, k_seg, prefix),
    )


def _dkv_specs(mask: _Mask, dims, q_seg, k_seg, prefix):
    """In and out BlockSpecs of the dk/dv kernel (grid (nk, B, K); the query side whole, with the
    G heads of the kv head's group as one axis). dims: Sq, G, bk, D, Dv."""
    Sq, G, bk, D, Dv = dims
    scalar = pl.BlockSpec((SQ, SQ), lambda j, b, h: (b, j))  # table_t: [B|1, nk, nq]
    kv_spec = lambda d: pl.BlockSpec((SQ, bk, SQ, d), lambda j, b, h: (b, j, h, 0))  # noqa: E731
    group_spec = lambda d: pl.BlockSpec((SQ, Sq, SQ, G, d), lambda j, b, h: (b, 0, h, 0, 0))  # noqa: E731
    rows_spec = pl.BlockSpec((SQ, SQ, G, Sq), lambda j, b, h: (b, h, 0, 0))
    in_specs = [
        scalar,
        scalar,
        scalar,
        None if mask.window is None else scalar,
        group_spec(D),
        kv_spec(D),
        kv_spec(Dv),
        group_spec(Dv),
        rows_spec,
        rows_spec,
        pl.BlockSpec((Sq,), lambda j, b, h: (0,)) if mask.pos else None,
        pl.BlockSpec((bk,), lambda j, b, h: (j,)) if mask.pos else None,
        None if q_seg is None else pl.BlockSpec((SQ, Sq), lambda j, b, h: (b, 0)),
        None if k_seg is None else pl.BlockSpec((SQ, bk), lambda j, b, h: (b, j)),
        None if prefix is None else pl.BlockSpec((SQ,), lambda j, b, h: (b,)),
    ]
    return in_specs, [kv_spec(D), kv_spec(Dv)]


def _dkv_call(
    geo,
    q,
    k,
    v,
    q_pos,
    k_pos,
    q_seg,
    k_seg,
    do,
    lse2,
    delta,
    *,
    scale,
    bs,
    interpret,
    mask: _Mask,
    prefix=None,
):
    B, Sq, H, D = q.shape  # padded
    Sk, K, Dv = k.shape[1], k.shape[2], v.shape[3]
    G, nk, bk = H // K, Sk // geo.bk, geo.bk
    table_t = jnp.swapaxes(mask.table(q_pos, k_pos, q_seg, k_seg, geo.bq, bk, prefix), 1, 2)
    in_specs, out_specs = _dkv_specs(mask, (Sq, G, bk, D, Dv), q_seg, k_seg, prefix)
    group = lambda x: x.reshape(B, Sq, K, G, x.shape[3])  # noqa: E731  free reshape, no copy of kv
    rows = lambda x: x.reshape(B, K, G, Sq)  # noqa: E731
    kernel = functools.partial(
        kern.dkv_kernel,
        qk_scale=scale * kern.LOG2E,
        scale=scale,
        block_q=geo.bq,
        groups=G,
        precision=_precision(q.dtype),
        **dataclasses.asdict(mask),
        # Pallas' interpreter evaluates a scan over the group with its
        # body's carry types, which drop shard_map's varying axes: unrolled
        unrolled_groups=bool(interpret),
    )
    like = (q, k, v, do, q_seg, k_seg, prefix)
    out_shape = [struct((B, Sk, K, D), F32, *like), struct((B, Sk, K, Dv), F32, *like)]
    return pl.pallas_call(
        kernel,
        grid=(nk, B, K),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=_params(bs.bwd_warps, bs.bwd_stages),
        interpret=interpret,
        name="ring_step_dkv",
    )(
        *common.block_bounds(table_t, B, mask.window),
        *(group(q), k, v, group(do), rows(lse2), rows(delta)),
        *(*_positions(mask, q_pos, k_pos), q_seg, k_seg, prefix),
    )
