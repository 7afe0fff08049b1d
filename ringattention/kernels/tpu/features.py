"""Elementwise mask and optional step features of the Pallas TPU ring step (``pallas_tpu.py``).

The features of the step contract (``implementations.py``, "Optional features"), each static-off:

* ``softcap``: logits ``C * tanh(scale * q.k / C)`` (Gemma 2), masked after capping; the backward
  multiplies ``ds`` by ``1 - (s / C) ** 2``.
* ``prefix``: int32 [B], a bidirectional prefix per batch row. It reaches the kernels as a small
  VMEM block ``[8, 128]`` (the row's prefix broadcast) indexed by the batch grid index.
* ``bidirectional``: queries of negative segments see every key of their segment.
* ``v_head_dim``: v, o, do and dv have their own head dim (a second ``HeadView``).

The elementwise mask :func:`visible` agrees with ``masks.visible``; the block kinds come from
``masks.block_table`` with the same arguments (``blocks.tables``).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl

from ringattention.kernels.tpu.blocks import LANES, SUBLANES


def check_features(causal: bool, q_seg, batch: int, softcap, prefix, bidirectional: bool) -> None:
    """Raises ValueError for optional features the contract does not allow together."""
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap={softcap!r} must be a positive float or None")
    if prefix is not None:
        if not causal:
            raise ValueError("prefix is a relaxation of the causal mask: it needs causal=True")
        if prefix.shape != (batch,):
            raise ValueError(f"prefix must be int32 [B]; got {prefix.shape=} for B={batch}")
    if bidirectional and (not causal or q_seg is None):
        raise ValueError("bidirectional=True needs causal=True and segment ids")


def _sides(refs, rows_are_queries: bool):
    """(query side, key side) of a (query, key) pair of refs: the score rows' one as a column
    [rows, 1] (it is lane-broadcast), the columns' one as a row [1, cols] (sublane-broadcast)."""
    q_ref, k_ref = refs
    if rows_are_queries:
        return q_ref[...][:, :1], k_ref[...][:1, :]
    return q_ref[...][:1, :], k_ref[...][:, :1]


def visible(pos_refs, seg_refs, prefix_ref, cfg, rows_are_queries: bool):
    """bool [rows, cols] (queries x keys, or keys x queries): ``masks.visible`` on a block.

    ``cfg``: the kernel's ``frame._Cfg`` (causal, window, has_seg, prefix, bidirectional)."""
    vis = None
    qs, ks = _sides(seg_refs, rows_are_queries) if cfg.has_seg else (None, None)
    if cfg.positions:
        qp, kp = _sides(pos_refs, rows_are_queries)
    if cfg.causal:
        vis = kp <= qp
        if cfg.prefix:  # keys below the batch row's prefix: [1, 1] from the [8, 128] block
            vis = vis | (kp < prefix_ref[...][:1, :1])
        if cfg.bidirectional:  # queries of negative (bidirectional) segments
            vis = vis | (qs < 0)
    if cfg.window is not None:
        d = qp - kp
        one_sided = cfg.causal and not (cfg.prefix or cfg.bidirectional)  # then d >= 0 where visible
        near = d < cfg.window if one_sided else (d < cfg.window) & (-d < cfg.window)
        vis = near if vis is None else vis & near
    if cfg.has_seg:
        same = qs == ks
        vis = same if vis is None else vis & same
    return vis


def logits(qk, cfg):
    """q.k -> the logits: ``scale * q.k``, or ``C * tanh(scale * q.k / C)`` with ``cfg.softcap``
    (one multiply by the folded constant ``scale / C``). f32 [rows, cols]."""
    if cfg.softcap is None:
        return qk * cfg.scale
    return cfg.softcap * jnp.tanh(qk * (cfg.scale / cfg.softcap))


def cap_grad(ds, s, cfg):
    """``ds`` w.r.t. the capped logits ``s`` -> w.r.t. the scaled logits: ``ds * (1 - (s/C)^2)``."""
    if cfg.softcap is None:
        return ds
    t = s * (1.0 / cfg.softcap)  # tanh of the scaled logits
    return ds * (1.0 - t * t)


def prefix_aux(prefix):
    """Spec and arg of the prefix block: int32 [B, 8, 128] (the row's prefix everywhere), read at
    block (b, 0, 0) where b = the first grid index in every kernel."""
    arg = jnp.broadcast_to(prefix.astype(jnp.int32)[:, None, None], (prefix.shape[0], SUBLANES, LANES))
    return pl.BlockSpec((None, SUBLANES, LANES), lambda b, *rest: (b, 0, 0)), arg


def feature_cfg(causal: bool, q_seg, batch: int, softcap, prefix, bidirectional: bool) -> dict:
    """Checks the optional features and returns their ``_Cfg`` fields (static: the prefix values
    are data, only whether there is one is part of the kernel)."""
    check_features(causal, q_seg, batch, softcap, prefix, bidirectional)
    return dict(
        softcap=None if softcap is None else float(softcap),
        prefix=prefix is not None,
        bidirectional=bool(bidirectional),
    )
