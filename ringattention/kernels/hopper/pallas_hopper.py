"""Pallas Mosaic GPU (Hopper, sm_90) ring step: a FlashAttention-3 style forward (and backward).

The fused inner loop of Ring Attention (Liu, Zaharia & Abbeel 2023) for H100/H200 with the techniques
of FlashAttention-3 (Shah et al. 2024): warp specialisation (two compute warpgroups and a TMA producer
warpgroup), wgmma from swizzled shared memory, a multi-stage TMA pipeline for keys and values, and
ping-pong scheduling of the two compute warpgroups, or (head dim 128 without a causal mask) the
overlap of each block's softmax with the previous block's P·V inside a warpgroup. Kernel body:
``fwd_kernel.py`` and ``fwd_loops.py`` (the package's files: ``kernels/hopper/__init__.py``).

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
* backward, 16-bit, head dims <= 128 (default; ``BlockSizes(backward="fused")``): one
  FlashAttention-3 style kernel over key CTAs with TMA reduce-adds of dq (``cta_dq_bwd.py``,
  the two compute warpgroups sharing a dq tile); dq sums in a run-dependent order, so it is not
  bitwise deterministic.
* ``BlockSizes(backward="mosaic")``: Mosaic GPU dq and dk/dv kernels (``backward.py``,
  ``bwd_kernels.py``), deterministic; ``ring_attention(..., deterministic=True)`` picks it
  through :func:`deterministic_block_sizes`.
* backward, 16-bit, head dims 129-256 (default; ``BlockSizes(backward="mosaic")``, the only Mosaic
  backward there: "fused" is a ValueError): the dq and dk/dv kernels with the head dim split across
  the two compute warpgroups (``split_bwd.py``; FA3's head-dim-256 scheme, 64 rows per CTA,
  no atomics).
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
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:  # imported where used (_triton_step): nothing here needs Pallas Triton
    from ringattention.kernels.triton import pallas_gpu

F32 = jnp.float32
ROWS = 64  # wgmma's M per warpgroup
BLOCK_Q = ROWS  # query rows per compute warpgroup: one wgmma tile (a CTA holds two)
SMEM_LIMIT = 227 * 1024  # bytes of shared memory one CTA may use on sm_90
HALF_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
BACKWARDS = ("triton", "mosaic", "fused")  # BlockSizes.backward: the Triton step's kernels, or our own
REGISTERS = hm.REGISTER_CHOICES  # BlockSizes.registers: per compute-warpgroup thread
# BlockSizes.schedule of the forward's two compute warpgroups: "pingpong" (they alternate on the
# tensor cores) or "overlap" (each overlaps block j's softmax with block j-1's P.V, FA3's
# intra-warpgroup pipelining); docs/kernels.md gives the A/B behind each default.
SCHEDULES = ("pingpong", "overlap")


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tiles of the Mosaic GPU forward; ``triton`` configures the delegated Triton kernels.

    ``block_k``: keys per pipeline stage (a CTA holds two compute warpgroups of ``BLOCK_Q`` query
    rows); ``stages``: shared-memory slots for keys/values; ``schedule``: "pingpong" (the compute
    warpgroups alternate on the tensor cores) or "overlap" (the forward overlaps block j's softmax
    with block j-1's P·V inside each warpgroup, FlashAttention-3's intra-warpgroup pipelining,
    ``fwd_loops.overlap_loops``; the head-dim-128 default without a causal mask).
    ``backward``: "mosaic" (``bwd_kernels``: a dq and a dk/dv
    kernel, 64-row tiles, ``bwd_stages`` slots, the dq kernel streaming ``bwd_block_k`` keys per
    block; deterministic; above 128 ``split_bwd``'s
    deterministic dq and dk/dv kernels, which split the head dim: the default for head dim 256),
    "fused" (head dims <= 128: one kernel, ``cta_dq_bwd``, whose two compute warpgroups
    reduce-add dq into a float32 buffer in a run-dependent order, sharing one dq tile, each adding
    half its columns, or at head dims <= 64 taking turns; the default for head dims 64 and 128;
    above 128 a ValueError: "mosaic" is the backward there) or "triton" (``pallas_gpu``'s kernels,
    any head dim).
    ``registers``: per thread of a compute warpgroup in every Mosaic kernel (232 or 240; the
    producer keeps the rest of the launch allocation: 40 or 24). ``split_group`` (the fused
    backward with GQA; the other backwards ignore it): True runs one key CTA per *query* head
    instead of per kv head (k and v repeated over the group, dk/dv per query head summed over
    the group afterwards), so that the CTAs running side by side reduce-add into one query head's
    dq instead of the whole group's (on an H200 the group's float32 dq outgrows the L2 at long
    lengths: docs/kernels.md); it costs k, v per query head (16-bit) and dk, dv per query head
    (float32) of memory (``fused_bwd.split_group_extra_bytes``). None (the default) decides
    per call from the shapes (``fused_bwd.use_split_group``: split where the group's dq is
    >= 32 MiB per batch row, not causal at head dim 128, at most 8 GiB extra); False never splits.
    Defaults: :func:`default_block_sizes`.
    """

    block_k: int = 128
    stages: int = 2
    schedule: str = "pingpong"
    backward: str = "mosaic"
    bwd_stages: int = 2
    bwd_block_k: int = 64
    registers: int = 232
    triton: pallas_gpu.BlockSizes | None = None
    split_group: bool | None = None

    def __post_init__(self):
        if not isinstance(self.block_k, int) or self.block_k < 64 or self.block_k % 64:
            raise ValueError(f"BlockSizes.block_k={self.block_k!r} must be a positive multiple of 64")
        for name in ("stages", "bwd_stages"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 2:
                raise ValueError(f"BlockSizes.{name}={getattr(self, name)!r} must be an int >= 2")
        if self.bwd_block_k not in (64, 128):
            raise ValueError(f"BlockSizes.bwd_block_k={self.bwd_block_k!r} must be 64 or 128")
        if self.registers not in REGISTERS:
            raise ValueError(f"BlockSizes.registers={self.registers!r} must be one of {REGISTERS}")
        if self.backward not in BACKWARDS:
            raise ValueError(f"BlockSizes.backward={self.backward!r} must be one of {BACKWARDS}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"BlockSizes.schedule={self.schedule!r} must be one of {SCHEDULES}")
        if self.split_group is not None and not isinstance(self.split_group, bool):
            raise TypeError(f"BlockSizes.split_group={self.split_group!r} must be a bool or None")
        if self.backward == "triton" and _triton_step() is None:
            raise ValueError(
                "BlockSizes.backward='triton' runs pallas_gpu's Triton kernels, but this "
                "jax has no Pallas Triton backend (jax.experimental.pallas.triton does "
                "not import); use backward='mosaic' or 'fused'"
            )
        if self.triton is not None and not isinstance(self.triton, _triton_step().BlockSizes):
            raise TypeError(f"BlockSizes.triton={self.triton!r} must be a pallas_gpu.BlockSizes")


_DEFAULTS = {  # H200, docs/kernels.md
    # D=64: 256-key forward blocks (16K-128K forward 1.02-1.16x cuDNN against 0.93-1.04x for 128
    # keys in 3 stages, docs/kernels.md); the fused backward with one dq tile per CTA (the
    # warpgroups take turns; 0.89-1.01x against 0.86-1.01x with one tile per warpgroup, 0.88-0.95x
    # for the two-kernel one, 2026-12-01) through 3 stages and, causal, 240 registers
    # (_FULL_DEFAULTS: 232 without a causal mask).
    64: BlockSizes(block_k=256, stages=2, backward="fused", bwd_stages=3, registers=240),
    # D=128: the fused backward with one dq tile per CTA and 240 registers per compute thread
    # (64K fwd+bwd 0.95-0.99x cuDNN against 0.91-0.94x for one dq tile per warpgroup, 2026-12-01).
    128: BlockSizes(block_k=128, stages=2, backward="fused", registers=240),
    # D=256: the deterministic head-dim-split pair (split_bwd, no atomics): 64K fwd+bwd
    # 0.92-0.93x cuDNN; a fused split kernel adding dq by per-element float32 atomics ran
    # 0.37-0.43x (deleted: docs/kernels.md).
    256: BlockSizes(block_k=64, stages=2, backward="mosaic", registers=240),
}


# Without a causal mask the head-dim-128 forward overlaps each block's softmax with the previous
# block's P.V inside a warpgroup (FA3), with no ping-pong: 16K-128K forward 1.00-1.03x cuDNN against
# 0.97-1.00x (2026-12-01, docs/kernels.md). Causal it loses (0.97-1.07x against 1.01-1.10x), as
# does head dim 64 (0.89-0.96x against 0.97-1.02x). Head dim 64 without a causal mask keeps 232
# registers: with 240 its forward+backward ran 2-6% slower there (docs/kernels.md); with a causal
# mask 240 and 3 stages ran 1.02-1.05x cuDNN against 0.97-1.01x.
_FULL_DEFAULTS = {
    128: dataclasses.replace(_DEFAULTS[128], schedule="overlap"),
    64: dataclasses.replace(_DEFAULTS[64], registers=232),
}

# The two-kernel ("mosaic") backward of deterministic=True keeps its own tiles where the fused
# default's lost on it: head dim 64, 64K causal 0.95x cuDNN against 0.91x (docs/kernels.md); its dq
# kernel streams 128 keys per block there (64K, kv heads 8 and 32: 0.96x causal, 0.92-0.93x full,
# against 0.95x and 0.90-0.92x with 64; at head dim 128 a wash, 0.91-0.94x both; docs/kernels.md).
_DETERMINISTIC_TILES = {64: dict(bwd_stages=2, registers=232, bwd_block_k=128)}


def default_block_sizes(head_dim: int, causal: bool = True, v_head_dim: int | None = None) -> BlockSizes:
    """Defaults for the padded head dim (64, 128 or 256), from the H200 runs cited above.
    ``causal``: whether the step has a causal mask (without one, head dim 128 runs the forward with
    ``schedule="overlap"`` and head dim 64 its kernels with 232 registers per compute thread, not 240).
    ``v_head_dim``: v's own head dim where it differs: the row of the larger of the two, with MLA's
    forward tiles (:data:`_MLA_FORWARD`) where they pad to 192 and 128."""
    if v_head_dim is not None and v_head_dim != head_dim:
        bs = default_block_sizes(max(head_dim, v_head_dim), causal)
        if (_pad64(head_dim), _pad64(v_head_dim)) == (192, 128):
            return dataclasses.replace(bs, **_MLA_FORWARD, schedule=default_block_sizes(128, causal).schedule)
        return bs
    d = _tuned_dim(head_dim)
    return _DEFAULTS[d] if causal else _FULL_DEFAULTS.get(d, _DEFAULTS[d])


# MLA (q/k head dim 192, v 128; DeepSeek-V2), untuned: the forward's registers are those of head
# dim 128 (a [64, 128] accumulator and [64, 128] logits per warpgroup, the q/k width only lengthens
# the QK^T wgmma in shared memory), so it takes head dim 128's tiles and schedule: 128-key blocks in
# 2 stages (208 KiB of shared memory; 3 do not fit), 240 registers. The backward's fields are those
# of head dim 256 (the larger head dim).
_MLA_FORWARD = dict(block_k=128, stages=2, registers=240)


def _pad64(d: int) -> int:
    return -(-d // 64) * 64


def _tuned_dim(head_dim: int) -> int:
    """The head dim whose defaults ``head_dim`` takes: the smallest tuned one (64, 128, 256) that
    holds it."""
    return min((d for d in _DEFAULTS if d >= head_dim), default=256)


def deterministic_block_sizes(
    block_sizes: BlockSizes | None, head_dim: int, causal: bool = True
) -> BlockSizes:
    """The block sizes of ``ring_attention(..., deterministic=True)`` (``implementations.py``): the
    defaults for ``head_dim`` and ``causal``, with the fused backward replaced by the two-kernel
    "mosaic" one (with ``_DETERMINISTIC_TILES``' fields: at head dim 64 2 stages, 232 registers and
    128-key dq blocks).

    The fused backward's dq arrives by TMA reduce-adds from every key CTA, in the order the CTAs
    happen to run. The "mosaic" backward (``bwd_kernels``) has no cross-CTA sum: in the dq
    kernel each warpgroup owns 64 query rows, adds ``ds @ k`` over the key blocks in loop order
    (``lo`` .. ``hi``) in registers and writes its rows once; in the dk/dv kernel each warpgroup owns
    64 keys and adds over the group's query heads and the query blocks in an order fixed by the
    CTA's index (``visit``), then writes once. The forward is ordered the same way (each CTA owns
    its query rows), and so are the Triton backward (float32) and, above head dim 128, the "mosaic"
    pair of ``split_bwd``.
    """
    if block_sizes is None:
        bs = default_block_sizes(head_dim, causal)
        if bs.backward != "fused":
            return bs
        return dataclasses.replace(
            bs, backward="mosaic", **_DETERMINISTIC_TILES.get(_tuned_dim(head_dim), {})
        )
    if not isinstance(block_sizes, BlockSizes):
        raise TypeError(f"pallas_hopper: block_sizes={block_sizes!r} must be a pallas_hopper.BlockSizes")
    if block_sizes.backward == "fused":
        raise ValueError(
            "deterministic=True with pallas_hopper BlockSizes(backward='fused'): the fused "
            "backward reduce-adds dq in a run-dependent order; use backward='mosaic' "
            "or 'triton', or block_sizes=None"
        )
    return block_sizes


def available(mesh=None) -> bool:
    """True where the mesh being traced (``implementations.mesh_device``) is an NVIDIA Hopper GPU
    (H100, H200, H800, GH200: compute capability 9.x)."""
    if implementations.platform(mesh) != "gpu":
        return False
    kind = str(implementations.mesh_device(mesh).device_kind).upper()
    return any(name in kind for name in ("H100", "H200", "H800", "H20", "GH200"))


interpret_params = hm.interpret_params


def _triton_step():
    """The Triton step (``kernels/triton/pallas_gpu.py``), imported on first use (float32 inputs,
    ``BlockSizes(backward="triton")``); None where this jax has no Pallas Triton backend
    (deprecated since jax 0.11): nothing else of this step needs it."""
    try:
        from ringattention.kernels.triton import pallas_gpu
    except ImportError:
        return None
    return pallas_gpu


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
    """The Triton step's padded sizes (same fields), read as CTAs of ``2 * bq`` rows and key blocks
    of ``bk``."""

    @property
    def cta_rows(self) -> int:
        return hm.COMPUTE_WGS * self.bq


def geometry(sq: int, sk: int, d: int, bs: BlockSizes, dv: int | None = None) -> Geometry:
    """Padded sizes; ``dv``: v's own head dim (None: ``d``), padded to a multiple of 64 apart."""
    rows = hm.COMPUTE_WGS * BLOCK_Q
    bk = min(bs.block_k, -(-sk // 64) * 64)  # short shards: one block of the padded length
    dv_pad = 0 if dv is None or dv == d else _pad64(dv)
    return Geometry(sq, sk, d, BLOCK_Q, bk, -(-sq // rows) * rows, -(-sk // bk) * bk, _pad64(d), dv_pad)


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
):
    """One ring step forward (contract in ``implementations.py``, with the optional features
    softcap, prefix, bidirectional and v_head_dim). Returns (o f32, lse f32)."""
    _check(q, k, v, q_pos, k_pos, q_seg, k_seg, softmax_scale, own_v_dim=True)
    softcap, prefix = _features(q, q_seg, causal, softcap, prefix, bidirectional)
    B, Sq, H, D = q.shape
    Dv = v.shape[3]
    bs = block_sizes or default_block_sizes(D, causal, v_head_dim=Dv)
    if not isinstance(bs, BlockSizes):
        raise TypeError(f"pallas_hopper: block_sizes={bs!r} must be a pallas_hopper.BlockSizes")
    if jnp.dtype(q.dtype) not in HALF_DTYPES:  # float32: the Triton step (or XLA's), not wgmma
        return _triton_or_xla_step().forward_step(
            q,
            k,
            v,
            q_pos,
            k_pos,
            q_seg,
            k_seg,
            causal=causal,
            softmax_scale=softmax_scale,
            block_sizes=bs.triton,
            interpret=interpret,
            window=window,
            softcap=softcap,
            prefix=prefix,
            bidirectional=bidirectional,
        )
    geo = geometry(Sq, k.shape[1], D, bs, Dv)
    q, k, v, q_pos, k_pos, q_seg, k_seg = _pad(geo, q, k, v, q_pos, k_pos, q_seg, k_seg)
    table = masks.block_table(
        q_pos,
        k_pos,
        q_seg,
        k_seg,
        causal,
        geo.cta_rows,
        geo.bk,
        window,
        prefix=prefix,
        bidirectional=bidirectional,
    )  # [B|1, nq, nk]
    *bounds, edge = common.block_bounds(table, B, window)  # 3 x int32 [B, nq]; edge: window only
    extra = (q_pos, k_pos) if causal or window is not None else ()
    extra += (q_seg, k_seg) if q_seg is not None else ()
    extra += (edge,) if window is not None else ()
    extra += (prefix,) if prefix is not None else ()
    features = dict(softcap=softcap, prefix=prefix is not None, bidirectional=bidirectional)
    o, lse = _fwd_call(
        geo,
        bs,
        *bounds,
        q,
        k,
        v,
        *extra,
        causal=causal,
        segments=q_seg is not None,
        scale=softmax_scale,
        interpret=interpret,
        window=window,
        **features,
    )
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
    **features,
):
    """``features``: ``hm.FwdConfig``'s softcap, prefix, bidirectional (off where not given)."""
    B, Sq, H, D = q.shape  # padded
    K, Dv = k.shape[2], v.shape[3]  # v [B, Sk, K, Dv]
    nq = Sq // geo.cta_rows
    cfg = hm.FwdConfig(
        bq=geo.bq,
        bk=geo.bk,
        stages=bs.stages,
        causal=causal,
        segments=segments,
        groups=H // K,
        nq=nq,
        qk_scale=scale * hm.LOG2E,
        pingpong=bs.schedule == "pingpong",
        interpret=interpret,
        registers=bs.registers,
        window=window,
        overlap=bs.schedule == "overlap",
        **features,
    )
    smem = (hm.COMPUTE_WGS * geo.bq * D + bs.stages * geo.bk * (D + Dv)) * q.dtype.itemsize
    smem += 4 * (hm.COMPUTE_WGS * geo.bq + bs.stages * geo.bk) * (cfg.positions + segments)
    if smem > SMEM_LIMIT - 1024:
        dims = f"head dim {D}" + (f", v head dim {Dv}" if Dv != D else "")
        raise ValueError(
            f"pallas_hopper: block_k={geo.bk}, stages={bs.stages} at {dims} need "
            f"{smem} bytes of shared memory (limit {SMEM_LIMIT}); use fewer/smaller"
        )
    out_type = (jax.ShapeDtypeStruct((B, Sq, H, Dv), F32), jax.ShapeDtypeStruct((B, H, Sq), F32))
    kernel = hm.launch(
        functools.partial(hk.fwd_kernel, cfg=cfg),
        out_type,
        _scratch(cfg, D, q.dtype, Dv),
        grid=(H, nq, B),
        interpret=interpret,
    )
    return kernel(lo, mid, hi, q, k, v, *extra)


def _scratch(cfg: hm.FwdConfig, d: int, dtype, dv: int | None = None):
    """SMEM buffers and barriers, in the order ``hk._compute`` / ``hk._produce`` take them
    (``dv``: v's head dim where it has its own)."""
    tiles = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    wgs, s = hm.COMPUTE_WGS, cfg.stages
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
        plgpu.Barrier(num_arrivals=wgs),  # tensor-core turns
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
    the kernels: "fused" above 128 is a ValueError (whatever the dtype), "mosaic" is the
    head-dim-split pair there.
    """
    _check_backward(q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, softmax_scale)
    _, prefix = _features(q, q_seg, causal, softcap, prefix, bidirectional)  # int32 [B] | None
    D, Dv = q.shape[3], v.shape[3]
    head_dim = max(D, Dv)
    bs = block_sizes or default_block_sizes(head_dim, causal)
    if not isinstance(bs, BlockSizes):
        raise TypeError(f"pallas_hopper: block_sizes={bs!r} must be a pallas_hopper.BlockSizes")
    if bs.backward == "fused" and head_dim > 128:
        dims = f"head dim {D}" if Dv == D else f"head dim {head_dim} (q/k {D}, v {Dv})"
        raise ValueError(
            f"pallas_hopper BlockSizes(backward='fused'): {dims} is above "
            "128, where the Mosaic backward is 'mosaic' (the head-dim-split dq and dk/dv "
            "kernels); use backward='mosaic' or 'triton', or block_sizes=None"
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
    if head_dim > 128:  # "mosaic": the head-dim-split dq and dk/dv kernels, no atomics
        mosaic = hsb.backward
    else:
        mosaic = hcb.backward if bs.backward == "fused" else hb.backward
    return mosaic(q, k, v, do.astype(q.dtype), lse, delta, q_pos, k_pos, q_seg, k_seg, bs=bs, **kw)


reference_forward_step = reference.reference_forward_step
reference_backward_step = reference.reference_backward_step
