"""Visibility of keys to queries, shared by every implementation of a ring step.

A query at global position ``qp`` with segment id ``qs`` sees a key at ``kp`` with id ``ks`` iff
``ks == qs`` (when segment ids are given), ``kp <= qp`` (when causal) and ``|qp - kp| < window``
(with a sliding window, Longformer / Mistral style: Beltagy et al. 2020, Jiang et al. 2023).
Two masks relax the causal condition (and apply only when causal):

* ``prefix`` int [B]: a bidirectional prefix per batch row (prefix LM: Raffel et al. 2020, T5;
  PaliGemma): every key at ``kp < prefix[b]`` is visible, so the prefix sees itself both ways and
  everything after it is causal.
* ``bidirectional``: segments with a *negative* id are bidirectional (an image, or an encoder
  document packed among causal ones): their queries see every key of the same segment. Kernels
work on blocks, so besides the elementwise mask this module classifies whole (query block, key block)
pairs as

* ``SKIP``: no query of the block sees any key of the block (not computed at all),
* ``PARTIAL``: some do (computed with the elementwise mask),
* ``FULL``: every query sees every key (computed without a mask),

from per-block minima and maxima of positions and segment ids, so it is exact for any layout and any
placement of document boundaries (Blockwise Parallel Transformer, Liu & Abbeel 2023). With a window
the classification uses the range of position differences of a block pair: FULL stays exact, SKIP is
exact for blocks of consecutive positions and conservative (PARTIAL) otherwise.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

SKIP, PARTIAL, FULL = 0, 1, 2


def check_window(window: Any) -> None:
    """Raises ValueError unless ``window`` is None or a positive int (not a bool)."""
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"sliding_window={window!r} must be a positive int or None")


def visible(
    q_pos: jax.Array,
    k_pos: jax.Array,
    q_seg: jax.Array | None,
    k_seg: jax.Array | None,
    causal: bool,
    window: int | None = None,
    prefix: jax.Array | None = None,
    bidirectional: bool = False,
) -> jax.Array:
    """Elementwise visibility. q_pos [Sq], k_pos [Sk], q_seg [B, Sq] | None, k_seg [B, Sk] | None,
    prefix int [B] | None; ``bidirectional`` needs segment ids.

    Returns bool [B or 1, Sq, Sk].
    """
    mask = jnp.ones((1, q_pos.shape[0], k_pos.shape[0]), bool)
    if causal:
        before = k_pos[None, None, :] <= q_pos[None, :, None]  # [1, Sq, Sk]
        if prefix is not None:
            before = before | (k_pos[None, None, :] < prefix[:, None, None])  # [B, Sq, Sk]
        if bidirectional:
            before = before | (q_seg < 0)[:, :, None]  # [B, Sq, Sk]
        mask = mask & before
    if window is not None:
        d = q_pos[None, :, None] - k_pos[None, None, :]  # [1, Sq, Sk]
        mask = mask & (d < window) & (-d < window)
    if q_seg is not None:
        mask = mask & (q_seg[:, :, None] == k_seg[:, None, :])
    return mask


def _block_min_max(x, block: int):
    # x: [..., S] -> ([..., S // block], [..., S // block])
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    return xb.min(-1), xb.max(-1)


def block_table(
    q_pos: jax.Array,
    k_pos: jax.Array,
    q_seg: jax.Array | None,
    k_seg: jax.Array | None,
    causal: bool,
    block_q: int,
    block_k: int,
    window: int | None = None,
    prefix: jax.Array | None = None,
    bidirectional: bool = False,
) -> jax.Array:
    """Classifies block pairs as SKIP / PARTIAL / FULL. int32 [B or 1, Sq // block_q, Sk // block_k].

    q_pos [Sq], k_pos [Sk] int32; q_seg [B, Sq], k_seg [B, Sk] int or None. Sq and Sk must be multiples
    of the block sizes. ``window``: None or the sliding window (``|qp - kp| < window``); ``prefix``
    and ``bidirectional`` as in :func:`visible`.
    """
    if q_pos.shape[0] % block_q or k_pos.shape[0] % block_k:
        raise ValueError(f"{q_pos.shape=} {k_pos.shape=} not multiples of {block_q=} {block_k=}")
    any_visible = jnp.ones((1, q_pos.shape[0] // block_q, k_pos.shape[0] // block_k), bool)
    all_visible = any_visible
    if causal:
        qmin, qmax = _block_min_max(q_pos, block_q)  # [nq]
        kmin, kmax = _block_min_max(k_pos, block_k)  # [nk]
        any_c = kmin[None, None, :] <= qmax[None, :, None]  # [1, nq, nk]
        all_c = kmax[None, None, :] <= qmin[None, :, None]
        if prefix is not None:  # [B, 1, 1]: keys below the row's prefix are visible
            any_c = any_c | (kmin[None, None, :] < prefix[:, None, None])
            all_c = all_c | (kmax[None, None, :] < prefix[:, None, None])
        if bidirectional:  # [B, nq, 1]: some / every query of the block is in a negative segment
            qsmin, qsmax = _block_min_max(q_seg, block_q)
            any_c = any_c | (qsmin < 0)[:, :, None]
            all_c = all_c | (qsmax < 0)[:, :, None]
        any_visible = any_visible & any_c
        all_visible = all_visible & all_c
    if window is not None:
        any_w, all_w = _window_blocks(q_pos, k_pos, block_q, block_k, window)
        any_visible = any_visible & any_w
        all_visible = all_visible & all_w
    if q_seg is not None:
        qsmin, qsmax = _block_min_max(q_seg, block_q)  # [B, nq]
        ksmin, ksmax = _block_min_max(k_seg, block_k)  # [B, nk]
        overlap = (qsmin[:, :, None] <= ksmax[:, None, :]) & (ksmin[:, None, :] <= qsmax[:, :, None])
        single = (qsmin == qsmax)[:, :, None] & (ksmin == ksmax)[:, None, :]
        same = single & (qsmin[:, :, None] == ksmin[:, None, :])
        any_visible = any_visible & overlap
        all_visible = all_visible & same
    return jnp.where(all_visible, FULL, jnp.where(any_visible, PARTIAL, SKIP)).astype(jnp.int32)


def _window_blocks(q_pos, k_pos, block_q: int, block_k: int, window: int):
    # Differences qp - kp of a block pair lie in [near, far]: some may be inside (-window, window)
    # (conservative for gapped positions), all are iff both ends are. bool [1, nq, nk] each.
    qmin, qmax = _block_min_max(q_pos, block_q)  # [nq]
    kmin, kmax = _block_min_max(k_pos, block_k)  # [nk]
    near = (qmin[:, None] - kmax[None, :])[None]  # [1, nq, nk]
    far = (qmax[:, None] - kmin[None, :])[None]
    return (near < window) & (-far < window), (far < window) & (-near < window)
