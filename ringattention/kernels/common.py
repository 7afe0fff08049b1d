"""Pieces of a GPU ring step that need no Pallas backend, shared by ``triton/`` and ``hopper/``.

The fused inner loop of Ring Attention (Liu, Zaharia & Abbeel 2023) on GPUs, FlashAttention style
(Dao 2023; Shah et al. 2024): a step pads its shards to the kernels' block grid (padded keys carry
segment ids no query has, padded positions repeat the last one, head dims are zero-padded), turns
the block table of ``masks.block_table`` into per-row bounds (hidden blocks are never loaded, fully
visible ones run without the elementwise mask, a sliding window's far edge runs masked first), and
checks shapes and the optional features' keywords of the step contract
(``ringattention/implementations.py``). Plain ``jax.numpy``: importing this imports neither Triton
nor Mosaic GPU, so the Hopper step works on a jax without Pallas Triton.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from ringattention import masks

Q_PAD_SEG = -(2**31)  # segment ids of padded queries / keys: never equal to each other
K_PAD_SEG = -(2**31) + 1


def pad_to(x, axis: int, size: int, value=0):
    """``x`` zero- (or ``value``-) padded at the end of ``axis`` to ``size``; None stays None."""
    if x is None or x.shape[axis] == size:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, pad, constant_values=value)


def pad_pos(pos, size: int):
    # Padded entries repeat the last position so positions stay non-decreasing.
    if pos.shape[0] == size:
        return pos
    return jnp.concatenate([pos, jnp.broadcast_to(pos[-1], (size - pos.shape[0],))])


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Unpadded and padded sizes of a step and its blocks (``bq`` query rows, ``bk`` keys)."""

    sq: int  # unpadded shard lengths and head dim
    sk: int
    d: int
    bq: int
    bk: int
    sq_pad: int
    sk_pad: int
    d_pad: int
    dv_pad: int = 0  # v's padded head dim where it has its own; 0: d_pad

    @property
    def v_pad(self) -> int:
        return self.dv_pad or self.d_pad


def pad_inputs(geo: Geometry, q, k, v, q_pos, k_pos, q_seg, k_seg, *extra_q):
    """Pads to the block grid; padded keys get segment ids no query has. ``extra_q``: per-query
    arrays with v's head dim (do)."""
    if (geo.sq_pad, geo.sk_pad) != (geo.sq, geo.sk) and q_seg is None:
        q_seg = jnp.zeros(q.shape[:2], jnp.int32)
        k_seg = jnp.zeros(k.shape[:2], jnp.int32)
    pd = lambda x, s, d=geo.d_pad: pad_to(pad_to(x, 3, d), 1, s)  # noqa: E731
    q, k, v = pd(q, geo.sq_pad), pd(k, geo.sk_pad), pd(v, geo.sk_pad, geo.v_pad)
    extra_q = tuple(pd(x, geo.sq_pad, geo.v_pad) for x in extra_q)
    q_pos, k_pos = pad_pos(q_pos, geo.sq_pad), pad_pos(k_pos, geo.sk_pad)
    q_seg = pad_to(q_seg, 1, geo.sq_pad, Q_PAD_SEG)
    k_seg = pad_to(k_seg, 1, geo.sk_pad, K_PAD_SEG)
    return (q, k, v, q_pos, k_pos, q_seg, k_seg, *extra_q)


def bounds(table, batch: int):
    """Per row of a SKIP/PARTIAL/FULL table [B|1, n, m]: int32 [B, n] lo, mid, hi with
    [lo, hi) covering every non-SKIP column and [lo, mid) all FULL."""
    m = table.shape[-1]
    idx = jnp.arange(m, dtype=jnp.int32)
    vis = table != masks.SKIP
    hi = jnp.max(jnp.where(vis, idx + 1, 0), axis=-1)
    lo = jnp.minimum(jnp.min(jnp.where(vis, idx, m), axis=-1), hi)
    not_full = (table != masks.FULL) & (idx >= lo[..., None])
    mid = jnp.clip(jnp.min(jnp.where(not_full, idx, m), axis=-1), lo, hi)
    return tuple(jnp.broadcast_to(x, (batch, table.shape[1])).astype(jnp.int32) for x in (lo, mid, hi))


def edge_bounds(table, batch: int):
    """Like :func:`bounds` for rows that may start with partially visible blocks (a window's far
    edge): int32 [B, n] lo, mid, hi, edge with [lo, edge) partial or hidden, [edge, mid) all FULL,
    [mid, hi) the rest, and every non-SKIP column in [lo, hi)."""
    m = table.shape[-1]
    idx = jnp.arange(m, dtype=jnp.int32)
    vis = table != masks.SKIP
    hi = jnp.max(jnp.where(vis, idx + 1, 0), axis=-1)
    lo = jnp.minimum(jnp.min(jnp.where(vis, idx, m), axis=-1), hi)
    full = table == masks.FULL
    edge = jnp.clip(jnp.min(jnp.where(full & (idx >= lo[..., None]), idx, m), axis=-1), lo, hi)
    mid = jnp.clip(jnp.min(jnp.where(~full & (idx >= edge[..., None]), idx, m), axis=-1), edge, hi)
    return tuple(jnp.broadcast_to(x, (batch, table.shape[1])).astype(jnp.int32) for x in (lo, mid, hi, edge))


def block_bounds(table, batch: int, window):
    """(lo, mid, hi, edge): :func:`bounds` and edge None without a window, else
    :func:`edge_bounds`."""
    if window is None:
        return (*bounds(table, batch), None)
    return edge_bounds(table, batch)


def check(q, k, v, q_pos, k_pos, q_seg, k_seg, own_v_dim: bool = False, name: str = "pallas_gpu"):
    """Raises ValueError on shapes outside the contract (``own_v_dim``: v may have its own head
    dim <= 256); ``name``: the implementation the messages name."""
    B, Sq, H, D = q.shape
    v_ok = k.shape == v.shape or (
        own_v_dim and v.ndim == 4 and v.shape[:3] == k.shape[:3] and v.shape[3] <= 256
    )
    if k.ndim != 4 or not v_ok or k.shape[0] != B or k.shape[3] != D or H % k.shape[2]:
        raise ValueError(f"{name}: bad shapes {q.shape=} {k.shape=} {v.shape=}")
    if q_pos.shape != (Sq,) or k_pos.shape != (k.shape[1],):
        raise ValueError(f"{name}: {q_pos.shape=} {k_pos.shape=} must be [{Sq}] and [{k.shape[1]}]")
    if (q_seg is None) != (k_seg is None):
        raise ValueError(f"{name}: q_seg and k_seg must both be given or both be None")
    if q_seg is not None and (q_seg.shape != (B, Sq) or k_seg.shape != (B, k.shape[1])):
        raise ValueError(f"{name}: {q_seg.shape=} {k_seg.shape=} must be [B, shard]")
    if D > 256:
        raise ValueError(f"{name} supports head_dim <= 256; got {q.shape[3]=}")


def _positive(x) -> bool:
    try:
        return float(x) > 0
    except TypeError:  # also a traced value: the cap is static
        return False


def features(q, q_seg, causal: bool, softcap, prefix, bidirectional: bool, name: str = "pallas_gpu"):
    """Checks the optional features' keywords (``implementations.py``); returns the prefix as
    int32 [B] or None. ``name``: the implementation the messages name."""
    if softcap is not None and (isinstance(softcap, bool) or not _positive(softcap)):
        raise ValueError(f"{name}: softcap={softcap!r} must be a positive float")
    if bidirectional and (not causal or q_seg is None):
        raise ValueError(f"{name}: bidirectional=True needs causal=True and segment ids")
    if prefix is None:
        return None
    if not causal:
        raise ValueError(f"{name}: prefix needs causal=True")
    prefix = jnp.asarray(prefix, jnp.int32)
    if prefix.shape != (q.shape[0],):
        raise ValueError(f"{name}: {prefix.shape=} must be [{q.shape[0]}] (batch)")
    return prefix
