"""What the Pallas TPU ring step's kernels share: their static configuration and helpers.

The forward, dq and dk/dv kernels of ``pallas_tpu.py`` (FlashAttention-2 style, Dao 2023, for the
inner loop of Ring Attention, Liu, Zaharia & Abbeel 2023) are built on the same frame: ``_Cfg``
(the static switches of one kernel and how a grid step finds its block kind and fetched block in
the scalar-prefetched tables), ``_interpret`` (which interpreter ``interpret`` asks for),
``_dot`` (a float32-accumulating ``lax.dot_general``; ``NT``, ``NN``, ``TN`` its dimension
numbers), ``_split_refs`` (a kernel's refs: main operands, positions / segment ids / prefix, kind
blocks, outputs and scratch), ``_when_computed`` (a block's body masked, unmasked or not at all)
and ``_aux`` (the specs and arguments of positions, segment ids and the prefix block).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ringattention import masks
from ringattention.kernels.tpu.blocks import LANES, lane_col, sublane_row
from ringattention.kernels.tpu.features import prefix_aux

F32 = jnp.float32
NT = (((1,), (1,)), ((), ()))  # a @ b.T
NN = (((1,), (0,)), ((), ()))  # a @ b
TN = (((0,), (0,)), ((), ()))  # a.T @ b


@dataclasses.dataclass(frozen=True)
class _Cfg:
    causal: bool
    scale: float
    has_seg: bool
    batch_table: bool  # the block table has a batch dim (segment ids)
    n_outer: int  # blocks along the grid's outer sequence axis
    n_inner: int  # blocks along the reduction axis
    groups: int  # query heads per kv head
    f32_inputs: bool
    window: int | None = None  # sliding window: |q_pos - k_pos| >= window is hidden
    softcap: float | None = None  # logits C * tanh(s / C)
    prefix: bool = False  # a prefix block [8, 128] per batch row follows the segment ids
    bidirectional: bool = False  # negative segment ids: bidirectional segments
    # False: the kinds are read from scalar prefetch and SKIP blocks hold the last fetched buffer
    # (no DMA). True in Pallas' generic interpreter, which indexes with grid indices that do not vary
    # over the ring's manual axes while the tables do (shard_map's check_vma rejects the mix): there
    # each grid step's kind arrives as a (1,) block and every block is fetched (same results: SKIP
    # blocks are never computed).
    blocked_kinds: bool = False

    @property
    def positions(self) -> bool:
        return self.causal or self.window is not None

    @property
    def masked(self) -> bool:
        return self.causal or self.has_seg or self.window is not None

    def flat(self, b, outer, inner):
        tb = b if self.batch_table else 0
        return (tb * self.n_outer + outer) * self.n_inner + inner

    def fetched(self, fetch_ref, b, outer, inner):
        """The block along the inner axis held at grid step (b, outer, inner)."""
        return inner if self.blocked_kinds else fetch_ref[self.flat(b, outer, inner)]

    def partial_full(self, kind_ref, kind_blocks, b, outer, inner):
        """bool scalars: is the block at grid step (b, outer, inner) PARTIAL, FULL?"""
        if self.blocked_kinds:  # compared outside the kernel: no literal meets a varying value
            return [blk[...].reshape(()).astype(bool) for blk in kind_blocks]
        kind = kind_ref[self.flat(b, outer, inner)]
        return kind == masks.PARTIAL, kind == masks.FULL

    def kind_blocks(self, kind, index):
        """Specs and args of the (1,) blocks ``kind == PARTIAL`` and ``kind == FULL``
        (``blocked_kinds``); ``index``: grid -> (b, outer, inner)."""
        if not self.blocked_kinds:
            return [], []
        spec = pl.BlockSpec((1,), lambda *grid: (self.flat(*index(*grid)),))
        flat = kind.reshape(-1)
        return [spec] * 2, [(flat == k).astype(jnp.int32) for k in (masks.PARTIAL, masks.FULL)]


def _interpret(interpret):
    """``True``: Pallas' generic interpreter (runs anywhere, also inside the ring's per-device
    ``lax.cond``); a ``pltpu.InterpretParams``: TPU interpret mode, which simulates TPU memory (NaN
    for uninitialised VMEM, out-of-bounds checks) but holds a barrier across all devices at every
    kernel, so it suits single-step tests, not a ring whose devices skip different steps."""
    params = getattr(pltpu, "InterpretParams", None)
    if params is not None and isinstance(interpret, params):
        return interpret
    return bool(interpret)


def _dot(a, b, dims, cfg: _Cfg):
    # Explicit either way: a process-wide jax_default_matmul_precision="highest" would otherwise ask
    # Mosaic for an fp32 contraction of bf16 operands, which the TPU compiler rejects.
    prec = lax.Precision.HIGHEST if cfg.f32_inputs else lax.Precision.DEFAULT
    return lax.dot_general(a, b, dims, precision=prec, preferred_element_type=F32)


def _split_refs(refs, cfg: _Cfg, n_main: int):
    main, rest = refs[:n_main], refs[n_main:]
    pos = rest[:2] if cfg.positions else ()
    rest = rest[2:] if cfg.positions else rest
    seg = rest[:2] if cfg.has_seg else ()
    rest = rest[2:] if cfg.has_seg else rest
    prefix = rest[0] if cfg.prefix else None
    rest = rest[1:] if cfg.prefix else rest
    kind_blocks = rest[:2] if cfg.blocked_kinds else None
    return main, (pos, seg, prefix), kind_blocks, rest[2:] if cfg.blocked_kinds else rest


def _when_computed(cfg: _Cfg, body, kind_ref, kind_blocks, b, outer, inner):
    """Runs ``body(masked)`` for PARTIAL (masked) and FULL (unmasked) blocks, nothing for SKIP."""
    partial, full = cfg.partial_full(kind_ref, kind_blocks, b, outer, inner)
    if cfg.masked:  # without causal or segment masks every block is FULL
        pl.when(partial)(lambda: body(True))
    pl.when(full)(lambda: body(False))


def _aux_spec(block: int, col: bool, batched: bool, index):
    """Spec of a lane-broadcast column ([.., S, 128]) or sublane-broadcast row ([.., 8, S]) array.

    ``index(*grid, *prefetch) -> (batch, block index)``.
    """
    shape = (block, LANES) if col else (8, block)

    def idx(*a):
        b, blk = index(*a)
        pos = (blk, 0) if col else (0, blk)
        return (b, *pos) if batched else pos

    return pl.BlockSpec(((None,) if batched else ()) + shape, idx)


def _aux(cfg: _Cfg, q_pos, k_pos, q_seg, k_seg, prefix, bq: int, bk: int, q_index, k_index, q_rows: bool):
    """Specs and args of positions / segment ids / the prefix block; ``q_rows``: queries index the
    score rows."""
    specs, args = [], []
    pairs = [(q_pos, k_pos, False)] if cfg.positions else []
    pairs += [(q_seg, k_seg, True)] if cfg.has_seg else []
    for qx, kx, batched in pairs:
        for x, block, index, col in ((qx, bq, q_index, q_rows), (kx, bk, k_index, not q_rows)):
            specs.append(_aux_spec(block, col, batched, index))
            args.append((lane_col if col else sublane_row)(x.astype(jnp.int32)))
    if cfg.prefix:
        spec, arg = prefix_aux(prefix)
        specs, args = specs + [spec], args + [arg]
    return specs, args
