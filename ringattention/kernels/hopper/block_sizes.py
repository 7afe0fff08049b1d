"""Tiles of the Hopper ring step: ``BlockSizes`` and the H200-tuned defaults per head dim.

The tile configuration of the FlashAttention-3 style kernels (Shah et al. 2024) that run the inner
loop of Ring Attention (Liu, Zaharia & Abbeel 2023) on H100/H200: the frozen ``BlockSizes``
dataclass and what it may hold (``BACKWARDS``, ``REGISTERS``, ``SCHEDULES``; the fixed
``BLOCK_Q`` rows of a compute warpgroup, the ``SMEM_LIMIT`` its tiles must fit), the defaults per
padded head dim (:func:`default_block_sizes`: ``_DEFAULTS``, ``_FULL_DEFAULTS`` without a causal
mask, ``_MLA`` for q/k 192 with v 128) and those of ``deterministic=True``
(:func:`deterministic_block_sizes`, ``_DETERMINISTIC_TILES``). As in FlashAttention-3's
``hopper/tile_size.h``, each tuned default sits beside its one-line reason (the A/B runs behind them:
docs/kernels.md). ``pallas_hopper.py`` re-exports the public names (``pallas_hopper.BlockSizes``;
the contract in ``ringattention/implementations.py`` looks ``deterministic_block_sizes`` up there).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ringattention.kernels.hopper import mosaic as hm

if TYPE_CHECKING:  # imported where used (_triton_step): nothing here needs Pallas Triton
    from ringattention.kernels.triton import pallas_gpu

ROWS = 64  # wgmma's M per warpgroup
BLOCK_Q = ROWS  # query rows per compute warpgroup: one wgmma tile (a CTA holds two)
SMEM_LIMIT = 227 * 1024  # bytes of shared memory one CTA may use on sm_90
BACKWARDS = ("triton", "mosaic", "fused")  # BlockSizes.backward: the Triton step's kernels, or our own
REGISTERS = hm.REGISTER_CHOICES  # BlockSizes.registers: per compute-warpgroup thread
# BlockSizes.schedule of the forward's compute warpgroups: "pingpong" (two alternate on the tensor
# cores), "overlap" (each of two overlaps block j's softmax with block j-1's P.V, FA3's
# intra-warpgroup pipelining) or "pingpong3" (three take turns: 192-row CTAs, 160 registers per
# compute thread; shards under 192 rows run two); docs/kernels.md gives the A/B behind each default.
SCHEDULES = ("pingpong", "overlap", "pingpong3")


def _triton_step():
    """The Triton step (``kernels/triton/pallas_gpu.py``), imported on first use (float32 inputs,
    ``BlockSizes(backward="triton")``); None where this jax has no Pallas Triton backend
    (deprecated since jax 0.11): nothing else of this step needs it."""
    try:
        from ringattention.kernels.triton import pallas_gpu
    except ImportError:
        return None
    return pallas_gpu


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tiles of the Mosaic GPU forward; ``triton`` configures the delegated Triton kernels.

    ``block_k``: keys per pipeline stage (a CTA holds two compute warpgroups of ``BLOCK_Q`` query
    rows); ``stages``: shared-memory slots for keys/values; ``schedule``: "pingpong" (the compute
    warpgroups alternate on the tensor cores), "pingpong3" (the forward runs three compute
    warpgroups taking turns, ``fwd_kernel._Turns``, 160 registers per compute thread whatever
    ``registers`` says; the default at head dims 64 and 128) or "overlap" (the forward
    overlaps block j's softmax with block j-1's P·V inside each warpgroup, FlashAttention-3's
    intra-warpgroup pipelining, ``fwd_loops.overlap_loops``; MLA's default without a causal
    mask).
    ``backward``: "mosaic" (``bwd_kernels``: a dq and a dk/dv
    kernel, 64-row tiles, ``bwd_stages`` slots, the dq kernel streaming ``bwd_block_k`` keys per
    block; deterministic; above 128 ``split_bwd``'s
    deterministic dq and dk/dv kernels, which split the head dim: the default for head dim 256),
    "fused" (head dims <= 128 and MLA's q/k 192 with v <= 128: one kernel, ``cta_dq_bwd``, whose
    two compute warpgroups reduce-add dq into a float32 buffer in a run-dependent order, sharing
    one dq tile, each adding half its columns (at 192 three 64-column tiles, two and one), or at
    head dims <= 64 taking turns; the default for head dims 64, 128 and MLA's 192 / 128; other
    head dims above 128 a ValueError: "mosaic" is the backward there) or "triton" (``pallas_gpu``'s kernels,
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
    # D=64: three compute warpgroups over 128-key blocks: H100 causal forward 1.13x / 1.33x /
    # 1.14x / 1.18x the two warpgroups' speed over 256-key blocks at 16K / 32K / 64K / 128K
    # (2026-12-07), without a causal mask 1.15x / 1.14x at 32K / 128K (2026-12-08). The fused
    # backward with one dq tile per CTA (the warpgroups take turns; 0.89-1.01x cuDNN against
    # 0.86-1.01x with one tile per warpgroup, 0.88-0.95x for the two-kernel one, 2026-12-01)
    # through 3 stages and, causal, 240 registers (_FULL_DEFAULTS: 232 without a causal mask).
    64: BlockSizes(
        block_k=128, stages=2, schedule="pingpong3", backward="fused", bwd_stages=3, registers=240
    ),
    # D=128: the fused backward with one dq tile per CTA and 240 registers per compute thread
    # (64K fwd+bwd 0.95-0.99x cuDNN against 0.91-0.94x for one dq tile per warpgroup, 2026-12-01).
    # The forward's three compute warpgroups take turns (schedule="pingpong3", 192-row CTAs; its
    # compute threads have 160 registers, the backward's 240): H100 32K / 128K causal forward
    # 1.11x / 1.11x the two's speed, soft-capped 1.08x / 1.03x (2026-12-07, bitwise the same o);
    # without a causal mask 1.10x / 1.08x FA3's intra-warpgroup overlap's (2026-12-08, bitwise).
    128: BlockSizes(block_k=128, stages=2, schedule="pingpong3", backward="fused", registers=240),
    # D=256: the deterministic head-dim-split pair (split_bwd, no atomics): 64K fwd+bwd
    # 0.92-0.93x cuDNN; a fused split kernel adding dq by per-element float32 atomics ran
    # 0.37-0.43x (deleted: docs/kernels.md).
    256: BlockSizes(block_k=64, stages=2, backward="mosaic", registers=240),
}


# Without a causal mask (the forward's tiles and schedule as with one, H100 2026-12-08: 32K / 128K
# forward 1.10x / 1.12x cuDNN at head dim 128, 1.12x / 1.15x at 64; docs/kernels.md) head dim 64
# keeps 232 registers: with 240 its forward+backward ran 2-6% slower there (docs/kernels.md); with
# a causal mask 240 and 3 stages ran 1.02-1.05x cuDNN against 0.97-1.01x.
_FULL_DEFAULTS = {64: dataclasses.replace(_DEFAULTS[64], registers=232)}

# The two-kernel ("mosaic") backward of deterministic=True keeps its own tiles where the fused
# default's lost on it: head dim 64, 64K causal 0.95x cuDNN against 0.91x (docs/kernels.md); its dq
# kernel streams 128 keys per block there (64K, kv heads 8 and 32: 0.96x causal, 0.92-0.93x full,
# against 0.95x and 0.90-0.92x with 64; at head dim 128 a wash, 0.91-0.94x both; docs/kernels.md).
_DETERMINISTIC_TILES = {64: dict(bwd_stages=2, registers=232, bwd_block_k=128)}


def default_block_sizes(head_dim: int, causal: bool = True, v_head_dim: int | None = None) -> BlockSizes:
    """Defaults for the padded head dim (64, 128 or 256), from the H200 runs cited above.
    ``causal``: whether the step has a causal mask (without one, head dim 64 runs its kernels with
    232 registers per compute thread, not 240, and MLA its forward with ``schedule="overlap"``).
    ``v_head_dim``: v's own head dim where it differs: the row of the larger of the two, with MLA's
    tiles (:data:`_MLA`) where they pad to 192 and 128."""
    if v_head_dim is not None and v_head_dim != head_dim:
        bs = default_block_sizes(max(head_dim, v_head_dim), causal)
        if (_pad64(head_dim), _pad64(v_head_dim)) == (192, 128):
            return dataclasses.replace(bs, **_MLA, schedule="pingpong" if causal else "overlap")
        return bs
    d = _tuned_dim(head_dim)
    return _DEFAULTS[d] if causal else _FULL_DEFAULTS.get(d, _DEFAULTS[d])


# MLA (q/k head dim 192, v 128; DeepSeek-V2). Forward, untuned: its registers are those of head
# dim 128 (a [64, 128] accumulator and [64, 128] logits per warpgroup, the q/k width only lengthens
# the QK^T wgmma in shared memory), so it takes head dim 128's tiles and schedule: 128-key blocks in
# 2 stages (208 KiB of shared memory; 3 do not fit), 240 registers. Backward: the fused kernel
# (cta_dq_bwd's three dq tiles, 2 stages: 3 need 248 KiB), 32K causal fwd+bwd 1.09-1.10x the
# head-dim-split pair's speed on an H100 (docs/kernels.md).
_MLA = dict(block_k=128, stages=2, registers=240, backward="fused", bwd_stages=2)


def _pad64(d: int) -> int:
    return -(-d // 64) * 64


def _tuned_dim(head_dim: int) -> int:
    """The head dim whose defaults ``head_dim`` takes: the smallest tuned one (64, 128, 256) that
    holds it."""
    return min((d for d in _DEFAULTS if d >= head_dim), default=256)


def deterministic_block_sizes(
    block_sizes: BlockSizes | None, head_dim: int, causal: bool = True, v_head_dim: int | None = None
) -> BlockSizes:
    """The block sizes of ``ring_attention(..., deterministic=True)`` (``implementations.py``): the
    defaults for ``head_dim``, ``causal`` and ``v_head_dim`` (v's own head dim where it differs:
    MLA's forward tiles stay), with the fused backward replaced by the two-kernel
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
        bs = default_block_sizes(head_dim, causal, v_head_dim)
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
