"""Visibility of keys to queries, shared by every implementation of a ring step.

A query at global position ``qp`` with segment id ``qs`` sees a key at ``kp`` with id ``ks`` iff
``ks == qs`` (when segment ids are given) and ``kp <= qp`` (when causal). Kernels work on blocks, so
besides the elementwise mask this module classifies whole (query block, key block) pairs as

* ``SKIP``: no query of the block sees any key of the block (not computed at all),
* ``PARTIAL``: some do (computed with the elementwise mask),
* ``FULL``: every query sees every key (computed without a mask),

from per-block minima and maxima of positions and segment ids, so it is exact for any layout and any
placement of document boundaries (Blockwise Parallel Transformer, Liu & Abbeel 2023).
"""

from __future__ import annotations

import jax.numpy as jnp

SKIP, PARTIAL, FULL = 0, 1, 2


def visible(q_pos, k_pos, q_seg, k_seg, causal: bool):
    """Elementwise visibility. q_pos [Sq], k_pos [Sk], q_seg [B, Sq] | None, k_seg [B, Sk] | None.

    Returns bool [B or 1, Sq, Sk].
    """
    mask = jnp.ones((1, q_pos.shape[0], k_pos.shape[0]), bool)
    if causal:
        mask = mask & (k_pos[None, None, :] <= q_pos[None, :, None])
    if q_seg is not None:
        mask = mask & (q_seg[:, :, None] == k_seg[:, None, :])
    return mask


def _block_min_max(x, block: int):
    # x: [..., S] -> ([..., S // block], [..., S // block])
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    return xb.min(-1), xb.max(-1)


def block_table(q_pos, k_pos, q_seg, k_seg, causal: bool, block_q: int, block_k: int):
    """Classifies block pairs as SKIP / PARTIAL / FULL. int32 [B or 1, Sq // block_q, Sk // block_k].

    q_pos [Sq], k_pos [Sk] int32; q_seg [B, Sq], k_seg [B, Sk] int or None. Sq and Sk must be multiples
    of the block sizes.
    """
    if q_pos.shape[0] % block_q or k_pos.shape[0] % block_k:
        raise ValueError(f"{q_pos.shape=} {k_pos.shape=} not multiples of {block_q=} {block_k=}")
    any_visible = jnp.ones((1, q_pos.shape[0] // block_q, k_pos.shape[0] // block_k), bool)
    all_visible = any_visible
    if causal:
        qmin, qmax = _block_min_max(q_pos, block_q)  # [nq]
        kmin, kmax = _block_min_max(k_pos, block_k)  # [nk]
        any_visible = any_visible & (kmin[None, None, :] <= qmax[None, :, None])
        all_visible = all_visible & (kmax[None, None, :] <= qmin[None, :, None])
    if q_seg is not None:
        qsmin, qsmax = _block_min_max(q_seg, block_q)  # [B, nq]
        ksmin, ksmax = _block_min_max(k_seg, block_k)  # [B, nk]
        overlap = (qsmin[:, :, None] <= ksmax[:, None, :]) & (ksmin[:, None, :] <= qsmax[:, :, None])
        single = (qsmin == qsmax)[:, :, None] & (ksmin == ksmax)[:, None, :]
        same = single & (qsmin[:, :, None] == ksmin[:, None, :])
        any_visible = any_visible & overlap
        all_visible = all_visible & same
    return jnp.where(all_visible, FULL, jnp.where(any_visible, PARTIAL, SKIP)).astype(jnp.int32)
