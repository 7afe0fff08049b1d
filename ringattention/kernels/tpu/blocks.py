"""Block sizes, input checks, block tables and head views for the Pallas TPU ring step.

Helpers of ``pallas_tpu.py`` (Ring Attention with Blockwise Transformers, Liu, Zaharia & Abbeel
2023). TPU tiling: the last two dims of every block are multiples of (8 sublanes, 128 lanes) or the
whole array dim, so sequence blocks are multiples of 128 (they are the lane dim of per-row
statistics and of key positions) and heads are addressed as 128-wide column blocks of a ``[B, S,
heads * D]`` view when ``D % 128 == 0`` (no transpose in HBM), else through a ``[B, heads, S, D]``
copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from ringattention import masks

LANES, SUBLANES = 128, 8


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Query/key block lengths of the forward kernel and of both backward kernels (dq; dk/dv).

    Each must be a multiple of 128. A block longer than the shard is clamped to the shard; otherwise
    it must divide the shard (ValueError). ``BlockSizes.for_chip()`` gives per-generation defaults.
    """

    block_q: int = 512
    block_kv: int = 512
    block_q_bwd: int = 512
    block_kv_bwd: int = 512

    def __post_init__(self):
        for f in dataclasses.fields(self):
            val = getattr(self, f.name)
            if not isinstance(val, int) or val < LANES or val % LANES:
                raise ValueError(f"BlockSizes.{f.name}={val!r} must be a positive multiple of {LANES}")

    @classmethod
    def for_chip(cls, device_kind: str | None = None) -> BlockSizes:
        """Defaults for a TPU generation (``device_kind``: that of the mesh being traced, so a CPU
        host compiling for a TPU slice gets the slice's blocks; see ``implementations.mesh_device``)."""
        from ringattention import implementations  # here: implementations loads this module lazily

        if device_kind is None:
            device_kind = implementations.mesh_device().device_kind
        kind = device_kind.lower()
        for key, sizes in _GENERATION_DEFAULTS:
            if key in kind:
                return cls(*sizes)
        return cls()


# (device_kind substring, (block_q, block_kv, block_q_bwd, block_kv_bwd)); first match wins.
# Not tuned on hardware (none lent): chosen so a step's f32 score tiles (block_q x block_kv x 4 B,
# a few live at once) stay well inside the default scoped VMEM (16 MiB v4/v5e, 32 MiB v5p/v6e/v7).
_GENERATION_DEFAULTS = (
    ("v5 lite", (512, 1024, 512, 512)),  # v5e: 197 TF/s bf16, small scoped VMEM
    ("v5e", (512, 1024, 512, 512)),
    ("v6", (1024, 512, 512, 1024)),  # v6e: 256x256 MXU likes wider tiles
    ("tpu7", (1024, 512, 512, 1024)),  # TPU7x (Ironwood)
    ("v7", (1024, 512, 512, 1024)),
    ("v5", (512, 1024, 512, 512)),  # v5p
    ("v4", (512, 1024, 512, 512)),
    ("cpu", (128, 128, 128, 128)),  # interpret mode: small blocks, fast tests
)


def pick_block(length: int, request: int, name: str, explicit: bool) -> int:
    """Block along a shard of ``length``: clamped to the shard, must divide it, 128-aligned.

    Defaults (``explicit=False``) shrink to the largest multiple of 128 that divides the shard.
    """
    if length % LANES:
        raise ValueError(
            f"pallas_tpu needs shard lengths that are multiples of {LANES}; got "
            f"{length=} (use implementation='xla' for such shards)"
        )
    block = min(request, length)
    if not explicit:
        while length % block:
            block -= LANES
    if length % block:
        raise ValueError(f"shard length {length} is not a multiple of {name}={block}")
    return block


def resolve_blocks(block_sizes, sq: int, sk: int, backward: bool) -> tuple[int, int]:
    if block_sizes is not None and not isinstance(block_sizes, BlockSizes):
        raise TypeError(f"block_sizes must be a pallas_tpu BlockSizes or None; got {block_sizes!r}")
    explicit = block_sizes is not None
    bs = block_sizes if explicit else BlockSizes.for_chip()
    nq, nk = ("block_q_bwd", "block_kv_bwd") if backward else ("block_q", "block_kv")
    return (pick_block(sq, getattr(bs, nq), nq, explicit), pick_block(sk, getattr(bs, nk), nk, explicit))


def check_inputs(q, k, v, q_pos, k_pos, q_seg, k_seg) -> None:
    """Raises ValueError/TypeError for inputs that break the ring-step contract."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"expected q [B, Sq, H, D], k [B, Sk, K, D], v [B, Sk, K, Dv]; got "
            f"{q.shape=} {k.shape=} {v.shape=}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype; got {q.dtype=} {k.dtype=} {v.dtype=}")
    (b, sq, h, d), (bk, sk, kh, dk) = q.shape, k.shape
    if b != bk or d != dk or kh == 0 or h % kh:
        raise ValueError(
            f"q and k must agree in batch and head_dim, with heads a multiple of kv "
            f"heads; got {q.shape=} {k.shape=}"
        )
    if q_pos.shape != (sq,) or k_pos.shape != (sk,):
        raise ValueError(
            f"positions must be [Sq], [Sk]; got {q_pos.shape=} {k_pos.shape=} for {q.shape=} {k.shape=}"
        )
    if (q_seg is None) != (k_seg is None):
        raise ValueError("q_seg and k_seg must both be given or both be None")
    if q_seg is not None and (q_seg.shape != (b, sq) or k_seg.shape != (b, sk)):
        raise ValueError(f"segment ids must be [B, Sq], [B, Sk]; got {q_seg.shape=} {k_seg.shape=}")


def tables(
    q_pos,
    k_pos,
    q_seg,
    k_seg,
    causal: bool,
    bq: int,
    bk: int,
    window: int | None = None,
    prefix=None,
    bidirectional: bool = False,
):
    """Block kinds and the block to hold at each grid step, both int32 [Bt, nq, nk] (Bt = B or 1).
    ``window``, ``prefix``, ``bidirectional``: as in ``masks.block_table``.

    ``fetch[.., i, j]`` is ``j`` for computed blocks and the last computed block before ``j`` (else
    the next one) for SKIP blocks, so the pipeline re-uses the buffer and issues no DMA for them.
    """
    kind = masks.block_table(
        q_pos, k_pos, q_seg, k_seg, causal, bq, bk, window, prefix=prefix, bidirectional=bidirectional
    )  # [Bt, nq, nk]
    return kind, fetch_index(kind)


def fetch_index(kind):
    n = kind.shape[-1]
    idx = lax.broadcasted_iota(jnp.int32, kind.shape, kind.ndim - 1)
    live = kind != masks.SKIP
    prev = lax.cummax(jnp.where(live, idx, -1), axis=kind.ndim - 1)
    nxt = lax.cummin(jnp.where(live, idx, n), axis=kind.ndim - 1, reverse=True)
    return jnp.where(prev >= 0, prev, jnp.where(nxt < n, nxt, 0)).astype(jnp.int32)


def lane_col(x):
    """[..., S] -> [..., S, 128]: a per-row value broadcast along lanes (read as a column)."""
    return jnp.broadcast_to(x[..., None], (*x.shape, LANES))


def sublane_row(x):
    """[..., S] -> [..., 8, S]: a per-column value broadcast along sublanes (read as a row)."""
    return jnp.broadcast_to(x[..., None, :], (*x.shape[:-1], SUBLANES, x.shape[-1]))


@dataclasses.dataclass(frozen=True)
class HeadView:
    """How a [B, S, N, D] array is tiled: ``flat`` = [B, S, N*D] with (block, D) column tiles."""

    flat: bool
    head_dim: int

    @classmethod
    def for_dim(cls, head_dim: int) -> HeadView:
        return cls(head_dim % LANES == 0, head_dim)

    def view(self, x):
        b, s, n, d = x.shape
        return x.reshape(b, s, n * d) if self.flat else x.transpose(0, 2, 1, 3)

    def unview(self, x, heads: int):
        if self.flat:
            return x.reshape(x.shape[0], x.shape[1], heads, self.head_dim)
        return x.transpose(0, 2, 1, 3)

    def shape(self, b: int, s: int, n: int) -> tuple[int, ...]:
        return (b, s, n * self.head_dim) if self.flat else (b, n, s, self.head_dim)

    def spec(self, block: int, index: Callable) -> pl.BlockSpec:
        """``index(*grid, *prefetch) -> (batch, seq_block, head)``."""
        d = self.head_dim
        if self.flat:
            return pl.BlockSpec((None, block, d), index)

        def idx(*args):
            b, s, h = index(*args)
            return b, h, s, 0

        return pl.BlockSpec((None, None, block, d), idx)
