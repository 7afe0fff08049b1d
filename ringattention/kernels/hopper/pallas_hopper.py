"""Pallas Mosaic GPU (Hopper, sm_90) ring step: a FlashAttention-3 style forward (and backward).

The fused inner loop of Ring Attention (Liu, Zaharia & Abbeel 2023) for H100/H200 with the techniques
of FlashAttention-3 (Shah et al. 2024): warp specialisation (two compute warpgroups and a TMA producer
warpgroup), wgmma from swizzled shared memory, a multi-stage TMA pipeline for keys and values, and
ping-pong scheduling of the compute warpgroups (at head dims 64 and 128 three of them taking turns,
``schedule="pingpong3"``), or (MLA without a causal mask) the overlap of each block's softmax
with the previous block's P·V inside a warpgroup. Kernel body:
``fwd_kernel.py`` and ``fwd_loops.py``; ``BlockSizes`` and the tuned defaults: ``block_sizes.py``,
re-exported here (the package's files: ``kernels/hopper/__init__.py``).

Masks and padding are those of the Triton step, shared through ``kernels/common.py`` (which needs
no Pallas backend), not re-implemented: global positions (any layout) and segment ids are padded
with the same sentinels, blocks are classified by ``masks.block_table`` and turned into the same
lo/mid/hi bounds (hidden blocks are never loaded, fully visible ones run without the elementwise
mask). GQA reads kv head ``h // G`` in place. Nothing of 16-bit inputs needs Pallas Triton: this
module imports the Triton step only for float32 inputs and ``BlockSizes(backward="triton")``.

The forward and every Mosaic backward take the contract's optional features (soft-capping, a
bidirectional prefix, bidirectional segments and v's own head dim, e.g. MLA's 192 / 128) for
16-bit inputs (each feature a static switch: off, the kernel is the one without it).

What runs where (stated plainly):

* forward, bfloat16/float16: the Mosaic GPU kernel (head dims padded to a multiple of 64, <= 256).
* forward, float32: delegated to the Triton step (wgmma would compute in tf32); where this jax has
  no Pallas Triton backend (deprecated since jax 0.11), to the XLA step (``ringattention.blockwise``).
* backward, 16-bit, head dims <= 128 and MLA's q/k 192 with v 128 (default;
  ``BlockSizes(backward="fused")``, :func:`fused_takes`): one FlashAttention-3 style kernel over
  key CTAs with TMA reduce-adds of dq (``cta_dq_bwd.py``, the two compute warpgroups sharing a dq
  tile); dq sums in a run-dependent order, so it is not bitwise deterministic.
* ``BlockSizes(backward="mosaic")``: Mosaic GPU dq and dk/dv kernels (``backward.py``,
  ``bwd_kernels.py``), deterministic; ``ring_attention(..., deterministic=True)`` picks it
  through :func:`deterministic_block_sizes`.
* backward, 16-bit, head dims 129-256 but MLA's (default; ``BlockSizes(backward="mosaic")``, the
  only Mosaic backward there: "fused" is a ValueError): the dq and dk/dv kernels with the head dim
  split across the two compute warpgroups (``split_bwd.py``; FA3's head-dim-256 scheme, 64 rows per
  CTA, no atomics; MLA's with ``backward="mosaic"`` or ``deterministic=True``).
  Every Mosaic backward is checked on an H200 against the float32 step reference
  (docs/kernels.md).
* backward, float32, or ``BlockSizes(backward="triton")``: the Triton step
  ``pallas_gpu.backward_step`` (it needs only the global lse and delta, so it composes with this
  forward unchanged; deterministic at every head dim); float32 without Pallas Triton: the XLA
  step's, and ``backward="triton"`` is then a ValueError.

``interpret=True`` runs the Mosaic GPU kernels in Mosaic GPU's interpret mode on CPU (the same
kernels, barriers and TMA pipelines; wgmma and register layouts replaced by plain ``jnp``, see
``mosaic.Ops``) and the Triton ones in the Triton interpreter. That interpreter simulates
one GPU: interpret-mode rings over several devices are not supported (use ``pallas_gpu`` there).
Contract: ``ringattention/implementations.py``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

from ringattention import blockwise, implementations, masks
from ringattention.kernels import common, reference
from ringattention.kernels.hopper import backward as hb
from ringattention.kernels.hopper import cta_dq_bwd as hcb
from ringattention.kernels.hopper import fwd_kernel as hk
from ringattention.kernels.hopper import mosaic as hm
from ringattention.kernels.hopper import split_bwd as hsb
from ringattention.kernels.hopper.block_sizes import (  # noqa: F401  (the step's names: ph.BlockSizes, ...)
    BACKWARDS,
    BLOCK_Q,
    REGISTERS,
    ROWS,
    SCHEDULES,
    SMEM_LIMIT,
    BlockSizes,
    _pad64,
    _triton_step,
    default_block_sizes,
    deterministic_block_sizes,
)

F32 = jnp.float32
HALF_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def available(mesh=None) -> bool:
    """True where the mesh being traced (``implementations.mesh_device``) is an NVIDIA Hopper GPU
    (H100, H200, H800, GH200: compute capability 9.x)."""
    if implementations.platform(mesh) != "gpu":
        return False
    kind = str(implementations.mesh_device(mesh).device_kind).upper()
    return any(name in kind for name in ("H100", "H200", "H800", "H20", "GH200"))


interpret_params = hm.interpret_params


def _triton_or_xla_step():
    """The step for float32 inputs (wgmma would compute in tf32) and ``backward="triton"``: the
    Triton step, exact to ~1e-6, or where this jax has no Pallas Triton the XLA step
    (``ringattention.blockwise``: the same contract and optional features). ``BlockSizes.triton``
    is then None (it is a ``pallas_gpu.BlockSizes``): the XLA step's defaults; and ``backward`` is
    not "triton" (``BlockSizes`` refuses it there)."""
    return _triton_step() or blockwise


def _check(q, k, v, q_pos, k_pos, q_seg, k_seg, softmax_scale, own_v_dim: bool = False):
    common.check(q, k, v, q_pos, k_pos, q_seg, k_seg, own_v_dim=own_v_dim, name="pallas_hopper")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"pallas_hopper: {q.dtype=} {k.dtype=} {v.dtype=} must be equal")
    if not softmax_scale > 0:  # the kernels take row maxima of the unscaled logits
        raise ValueError(f"pallas_hopper: {softmax_scale=} must be positive")


@dataclasses.dataclass(frozen=True)
class Geometry(common.Geometry):
    """The Triton step's padded sizes (same fields), read as CTAs of ``wgs * bq`` rows (``wgs``
    compute warpgroups) and key blocks of ``bk``."""

    wgs: int = hm.COMPUTE_WGS

    @property
    def cta_rows(self) -> int:
        return self.wgs * self.bq

    @property
    def nq(self) -> int:
        """CTAs along the shard (three warpgroups: the last may overlap the one before it)."""
        return -(-self.sq_pad // self.cta_rows)


def geometry(sq: int, sk: int, d: int, bs: BlockSizes, dv: int | None = None) -> Geometry:
    """Padded sizes; ``dv``: v's own head dim (None: ``d``), padded to a multiple of 64 apart.
    ``schedule="pingpong3"`` runs three compute warpgroups where the shard pads to at least their
    192 rows (shorter shards: two), with the shard padded to a multiple of 64 rows only."""
    bk = min(bs.block_k, -(-sk // 64) * 64)  # short shards: one block of the padded length
    dv_pad = 0 if dv is None or dv == d else _pad64(dv)
    wgs = 3 if bs.schedule == "pingpong3" and _pad64(sq) >= 3 * BLOCK_Q else hm.COMPUTE_WGS
    rows = BLOCK_Q if wgs == 3 else wgs * BLOCK_Q
    sq_pad = -(-sq // rows) * rows
    return Geometry(sq, sk, d, BLOCK_Q, bk, sq_pad, -(-sk // bk) * bk, _pad64(d), dv_pad, wgs)


def _cta_queries(geo: Geometry, q_pos, q_seg):
    """q_pos [Sq], q_seg [B, Sq] | None as the CTAs see them: where ``cta_rows`` does not divide the
    padded shard, the last CTA's rows are the shard's last ``cta_rows`` (``fwd_kernel.cta_rows``),
    gathered so that ``masks.block_table`` classifies its blocks for the rows it holds."""
    if geo.sq_pad % geo.cta_rows == 0:
        return q_pos, q_seg
    start, _ = hk.cta_rows(geo.wgs, jnp.arange(geo.nq), geo.sq_pad, geo.bq)  # [nq]
    rows = (start[:, None] + jnp.arange(geo.cta_rows)[None, :]).reshape(-1)  # [nq * cta_rows]
    return q_pos[rows], (None if q_seg is None else q_seg[:, rows])


def _pad(geo: Geometry, q, k, v, q_pos, k_pos, q_seg, k_seg):
    """Pads to the CTA/block grid with the GPU steps' sentinels (padded keys are seen by no query)."""
    cta = common.Geometry(
        geo.sq, geo.sk, geo.d, geo.cta_rows, geo.bk, geo.sq_pad, geo.sk_pad, geo.d_pad, geo.dv_pad
    )
    return common.pad_inputs(cta, q, k, v, q_pos, k_pos, q_seg, k_seg)


def _features(q, q_seg, causal: bool, softcap, prefix, bidirectional: bool):
    """The optional features' keywords checked as the Triton step checks them (``common.features``):
    (softcap float | None, prefix int32 [B] | None)."""
    prefix = common.features(q, q_seg, causal, softcap, prefix, bidirectional, name="pallas_hopper")
    return (None if softcap is None else float(softcap)), prefix


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
    out_dtype=None,
):
    """One ring step forward (contract in ``implementations.py``, with the optional features
    softcap, prefix, bidirectional and v_head_dim). Returns (o, lse f32): o in ``out_dtype``
    (float32 or q's dtype; None: float32), which the kernel writes."""
    _check(q, k, v, q_pos, k_pos, q_seg, k_seg, softmax_scale, own_v_dim=True)
    out_dtype = jnp.dtype(F32 if out_dtype is None else out_dtype)
    if out_dtype not in (jnp.dtype(F32), jnp.dtype(q.dtype)):
        raise ValueError(f"pallas_hopper: out_dtype={out_dtype} must be float32 or q's dtype ({q.dtype=})")
    softcap, prefix = _features(q, q_seg, causal, softcap, prefix, bidirectional)
    B, Sq, H, D = q.shape
    Dv = v.shape[3]
    bs = block_sizes or default_block_sizes(D, causal, v_head_dim=Dv)
    if not isinstance(bs, BlockSizes):
        raise TypeError(f"pallas_hopper: block_sizes={bs!r} must be a pallas_hopper.BlockSizes")
    if jnp.dtype(q.dtype) not in HALF_DTYPES:  # float32: the Triton step (or XLA's), not wgmma
        kw = dict(causal=causal, softmax_scale=softmax_scale, interpret=interpret, window=window)
        kw.update(softcap=softcap, prefix=prefix, bidirectional=bidirectional, block_sizes=bs.triton)
        return _triton_or_xla_step().forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, **kw)  # o: float32
    geo = geometry(Sq, k.shape[1], D, bs, Dv)
    q, k, v, q_pos, k_pos, q_seg, k_seg = _pad(geo, q, k, v, q_pos, k_pos, q_seg, k_seg)
    cta_pos, cta_seg = _cta_queries(geo, q_pos, q_seg)
    mask_kw = dict(prefix=prefix, bidirectional=bidirectional)
    table = masks.block_table(cta_pos, k_pos, cta_seg, k_seg, causal, geo.cta_rows, geo.bk, window, **mask_kw)
    *bounds, edge = common.block_bounds(table, B, window)  # 3 x int32 [B, nq]; edge: window only
    extra = (q_pos, k_pos) if causal or window is not None else ()
    extra += (q_seg, k_seg) if q_seg is not None else ()
    extra += (edge,) if window is not None else ()
    extra += (prefix,) if prefix is not None else ()
    features = dict(softcap=softcap, prefix=prefix is not None, bidirectional=bidirectional)
    kw = dict(
        causal=causal, segments=q_seg is not None, scale=softmax_scale, interpret=interpret, window=window
    )
    o, lse = _fwd_call(geo, bs, *bounds, q, k, v, *extra, out_dtype=out_dtype, **kw, **features)
    return o[:, :Sq, :, :Dv], lse[:, :, :Sq]


def _fwd_call(
    geo: Geometry,
    bs: BlockSizes,
    lo,
    mid,
    hi,
    q,
    k,
    v,
    *extra,
    causal: bool,
    segments: bool,
    scale: float,
    interpret: bool,
    window: int | None = None,
    out_dtype=F32,
    **features,
):
    """``features``: ``hm.FwdConfig``'s softcap, prefix, bidirectional (off where not given);
    ``out_dtype``: o's (float32, or q's dtype where o is final)."""
    B, Sq, H, D = q.shape  # padded
    K, Dv = k.shape[2], v.shape[3]  # v [B, Sk, K, Dv]
    nq = geo.nq
    cfg = hm.FwdConfig(
        bq=geo.bq,
        bk=geo.bk,
        stages=bs.stages,
        causal=causal,
        segments=segments,
        groups=H // K,
        nq=nq,
        qk_scale=scale * hm.LOG2E,
        pingpong=bs.schedule in ("pingpong", "pingpong3"),
        interpret=interpret,
        registers=hm.THREE_WG_REGISTERS if geo.wgs == 3 else bs.registers,
        wgs=geo.wgs,
        window=window,
        overlap=bs.schedule == "overlap",
        **features,
    )
    smem = (geo.cta_rows * D + bs.stages * geo.bk * (D + Dv)) * q.dtype.itemsize
    smem += 4 * (geo.cta_rows + bs.stages * geo.bk) * (cfg.positions + segments)
    if smem > SMEM_LIMIT - 1024:
        dims = f"head dim {D}" + (f", v head dim {Dv}" if Dv != D else "")
        raise ValueError(
            f"pallas_hopper: block_k={geo.bk}, stages={bs.stages}, schedule={bs.schedule!r} "
            f"({geo.wgs} query tiles) at {dims} need {smem} bytes of shared memory (limit "
            f"{SMEM_LIMIT}); use fewer/smaller" + (", or schedule='pingpong'" if geo.wgs == 3 else "")
        )
    out_type = (jax.ShapeDtypeStruct((B, Sq, H, Dv), out_dtype), jax.ShapeDtypeStruct((B, H, Sq), F32))
    kernel = hm.launch(
        functools.partial(hk.fwd_kernel, cfg=cfg),
        out_type,
        _scratch(cfg, D, q.dtype, Dv),
        grid=(H, nq, B),
        interpret=interpret,
        wgs=cfg.wgs,
    )
    return kernel(lo, mid, hi, q, k, v, *extra)


def _scratch(cfg: hm.FwdConfig, d: int, dtype, dv: int | None = None):
    """SMEM buffers and barriers, in the order ``hk._compute`` / ``hk._produce`` take them
    (``dv``: v's head dim where it has its own)."""
    tiles = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    wgs, s = cfg.wgs, cfg.stages
    ivec = lambda n, length, on: plgpu.SMEM((n, length), jnp.int32) if on else None  # noqa: E731
    q_copies = 1 + cfg.positions + cfg.segments
    return [
        plgpu.SMEM((wgs, cfg.bq, d), dtype, transforms=tiles),  # q per compute warpgroup
        plgpu.SMEM((s, cfg.bk, d), dtype, transforms=tiles),  # k slots
        plgpu.SMEM((s, cfg.bk, dv or d), dtype, transforms=tiles),  # v slots
        ivec(wgs, cfg.bq, cfg.positions),
        ivec(s, cfg.bk, cfg.positions),  # q / k positions
        ivec(wgs, cfg.bq, cfg.segments),
        ivec(s, cfg.bk, cfg.segments),  # q / k segment ids
        plgpu.Barrier(num_arrivals=q_copies, num_barriers=wgs),  # q loaded
        plgpu.Barrier(num_arrivals=q_copies, num_barriers=s),  # k (+ positions, ids) loaded
        plgpu.Barrier(num_barriers=s),  # v loaded
        plgpu.Barrier(num_arrivals=wgs, num_barriers=s),  # k slot free
        plgpu.Barrier(num_arrivals=wgs, num_barriers=s),  # v slot free
        # tensor-core turns: one barrier of both (two warpgroups), or one each (fwd_kernel._Turns)
        plgpu.Barrier(num_arrivals=wgs) if wgs == 2 else plgpu.Barrier(num_barriers=wgs),
    ]


def _check_backward(q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, softmax_scale):
    """``_check`` with v's own head dim (v [B, Sk, K, Dv], do [B, Sq, H, Dv]) and the backward's
    do, lse, delta."""
    common.check(q, k, v, q_pos, k_pos, q_seg, k_seg, own_v_dim=True, name="pallas_hopper")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"pallas_hopper: {q.dtype=} {k.dtype=} {v.dtype=} must be equal")
    if not softmax_scale > 0:  # the kernels take row maxima of the unscaled logits
        raise ValueError(f"pallas_hopper: {softmax_scale=} must be positive")
    B, Sq, H, _ = q.shape
    if do.shape != (B, Sq, H, v.shape[3]) or lse.shape != delta.shape or lse.shape != (B, H, Sq):
        raise ValueError(f"pallas_hopper: {do.shape=} {lse.shape=} {delta.shape=} for {q.shape=} {v.shape=}")


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
    """One ring step backward (contract in ``implementations.py``, with its optional features
    softcap, prefix, bidirectional and v_head_dim). Returns float32 dq, dk, dv.

    Runs the Triton step's kernels unless ``block_sizes.backward`` is "mosaic" or "fused" (and q is
    16-bit). Every Mosaic backward takes a sliding window (``window``) and the optional features
    (docs/kernels.md). Head dims are those of q/k (D) and v (Dv); the larger picks the defaults and
    the kernels: "fused" above 128 is a ValueError (whatever the dtype) except for q/k up to 192
    with v up to 128 (MLA's, :func:`fused_takes`), "mosaic" is the head-dim-split pair there.
    """
    _check_backward(q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, softmax_scale)
    _, prefix = _features(q, q_seg, causal, softcap, prefix, bidirectional)  # int32 [B] | None
    D, Dv = q.shape[3], v.shape[3]
    head_dim = max(D, Dv)
    bs = block_sizes or default_block_sizes(D, causal, v_head_dim=Dv)
    if not isinstance(bs, BlockSizes):
        raise TypeError(f"pallas_hopper: block_sizes={bs!r} must be a pallas_hopper.BlockSizes")
    if bs.backward == "fused" and not fused_takes(D, Dv):
        dims = f"head dim {D}" if Dv == D else f"head dim {head_dim} (q/k {D}, v {Dv})"
        raise ValueError(
            f"pallas_hopper BlockSizes(backward='fused'): {dims} is above "
            "128 (other than q/k up to 192 with v up to 128, MLA's), where the Mosaic backward "
            "is 'mosaic' (the head-dim-split dq and dk/dv kernels); use backward='mosaic' or "
            "'triton', or block_sizes=None"
        )
    kw = dict(causal=causal, softmax_scale=softmax_scale, interpret=interpret)
    if window is not None:
        kw["window"] = window
    if softcap is not None:  # the optional features: passed on only when used, as the ring does
        kw["softcap"] = float(softcap)
    if prefix is not None:
        kw["prefix"] = prefix
    if bidirectional:
        kw["bidirectional"] = True
    if bs.backward == "triton" or jnp.dtype(q.dtype) not in HALF_DTYPES:
        return _triton_or_xla_step().backward_step(
            q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, block_sizes=bs.triton, **kw
        )
    if bs.backward == "fused":  # fused_takes(D, Dv) checked above
        mosaic = hcb.backward
    elif head_dim > 128:  # "mosaic": the head-dim-split dq and dk/dv kernels, no atomics
        mosaic = hsb.backward
    else:
        mosaic = hb.backward
    return mosaic(q, k, v, do.astype(q.dtype), lse, delta, q_pos, k_pos, q_seg, k_seg, bs=bs, **kw)


def fused_takes(head_dim: int, v_head_dim: int) -> bool:
    """Whether ``BlockSizes(backward="fused")`` takes these head dims: q/k padded to 64 or 128 with
    v up to 128, or MLA's q/k 192 with v up to 128 (dk [64, 192] and dv [64, 128] float32 per
    compute warpgroup: 160 registers per thread, ``cta_dq_bwd._three_tiles``); the rule the
    kernel's own check applies (``cta_dq_bwd.HEAD_DIMS``, ``MAX_V_HEAD_DIM``)."""
    return _pad64(head_dim) in hcb.HEAD_DIMS and _pad64(v_head_dim) <= hcb.MAX_V_HEAD_DIM


reference_forward_step = reference.reference_forward_step
reference_backward_step = reference.reference_backward_step
