"""Key-block loops of a compute warpgroup in the Hopper forward (``fwd_kernel.py``).

FlashAttention-3 (Shah et al. 2024): the online softmax in the log2 domain, then two schedules of
the loop over the key blocks ``[lo, hi)``. :func:`loops` runs one block per iteration (QK^T,
softmax, P·V), the two compute warpgroups optionally taking turns on the tensor cores (ping-pong).
:func:`overlap_loops` is FA3's intra-warpgroup overlap: block j's QK^T and block j-1's P·V are
issued together and block j's softmax runs while P·V is in flight (``schedule="overlap"``;
MLA's default without a causal mask). Both walk the ranges of
:meth:`Warpgroup.ranges`: the window's far edge ``[lo, edge)`` and ``[mid, hi)`` with the
elementwise mask, the fully visible blocks in between without it (``fwd_kernel``'s bounds).
Shapes in comments: ``bq`` rows per compute warpgroup, ``bk`` keys per block, ``D`` the padded
head dim, ``S`` stages.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from ringattention.kernels.hopper import warp_rescale
from ringattention.kernels.hopper.mosaic import FwdConfig, Ops


def capped(cfg: FwdConfig, s):
    """s [bq, bk]: the raw logits q.k, or with a soft cap C their ``tanh(softmax_scale * s / C)``
    (one multiply and one tanh per element: ``approx_math`` lowers it to ``tanh.approx.f32``),
    which ``softmax_stats`` scales by ``C * log2(e)`` (``FwdConfig.logit_scale``). The tanh is
    monotonic, so the row maximum of these is the capped row maximum. Masks apply after it."""
    if cfg.softcap is None:
        return s
    return jnp.tanh(s * cfg.cap_scale)


def online_softmax(cfg: FwdConfig, s, acc, m, l, masked: bool):
    """One key block of the online softmax: s [bq, bk] logits from :func:`capped` (-inf where
    hidden); acc [bq, Dv], m, l [bq] (m in log2 units of the scaled logits). The row maximum is
    taken of the unscaled logits, so each probability is one FMA and one exp2 (FA3):
    p = 2^(s*c - m). Returns acc, m, l, p."""
    m_new, l, p, alpha = softmax_stats(cfg, s, m, l, masked)
    return warp_rescale.rescale(acc, alpha, cfg.interpret), m_new, l, p


def softmax_stats(cfg: FwdConfig, s, m, l, masked: bool):
    """``online_softmax`` without the accumulator: (m, l, p [bq, bk], alpha [bq]), where the
    accumulator's rescale is ``acc * alpha``."""
    c = cfg.logit_scale  # qk_scale > 0 (checked by the wrapper), or C * log2(e) with a soft cap
    m_new = jnp.maximum(m, s.max(axis=1) * c)
    m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) if masked else m_new
    p = jnp.exp2(s * c - lax.broadcast_in_dim(m_use, s.shape, [0]))  # [bq, bk]
    alpha = jnp.exp2(m - m_use)  # [bq]
    return m_new, l * alpha + p.sum(axis=1), p, alpha


def rescale(acc, alpha):
    return acc * lax.broadcast_in_dim(alpha, acc.shape, [0])  # [bq, Dv] * [bq]


@dataclasses.dataclass(frozen=True)
class Warpgroup:
    """What a compute warpgroup's key-block loops use (``_compute`` builds it)."""

    cfg: FwdConfig
    ops: Ops
    q: Any  # SMEM [bq, D]
    k: Any  # SMEM [S, bk, D]
    v: Any  # SMEM [S, bk, Dv]
    k_bar: Any
    v_bar: Any
    k_free: Any
    v_free: Any
    turns: Any  # fwd_kernel._Turns: the ping-pong's hand-overs
    wait_keys: Any  # j -> None
    mask: Any  # (s, slot) -> s
    lo: Any
    mid: Any
    hi: Any
    edge: Any

    def slot(self, j):
        return lax.rem(j - self.lo, jnp.int32(self.cfg.stages))

    @property
    def masked(self) -> bool:
        """Whether the blocks past ``mid`` compare positions or ids."""
        return self.cfg.causal or self.cfg.segments or self.cfg.window is not None

    def ranges(self, start):
        """(first, end, masked) of the key-block loops from ``start`` on: the window's far edge
        (masked), the fully visible blocks, the masked ones."""
        out = []
        if self.edge is not None:
            out.append((start, self.edge, True))
            start = jnp.maximum(self.edge, start)
        return out + [(start, self.mid, False), (jnp.maximum(self.mid, start), self.hi, self.masked)]


def loops(w: Warpgroup):
    """One key block per iteration: QK^T, softmax, then P.V; returns (acc, m, l)."""
    cfg, ops = w.cfg, w.ops
    bq, d = w.q.shape[0], w.v.shape[-1]  # d: the accumulator's (v's) head dim

    def body(j, carry, masked: bool):
        acc, m, l = carry  # float32 [bq, Dv], [bq], [bq]; m in log2 units (scaled logits)
        slot = w.slot(j)
        s = capped(cfg, ops.qk(w.q, w.k.at[slot], (bq, cfg.bk), after_issue=w.turns.turn))  # [bq, bk]
        if masked:
            s = w.mask(s, slot)
        plgpu.barrier_arrive(w.k_free.at[slot])
        acc, m_new, l, p = online_softmax(cfg, s, acc, m, l, masked)
        p = p.astype(w.q.dtype)
        if d <= 128:  # keep the softmax ahead of the hand-over (FA3's instruction ordering)
            acc, l, m_new, p = lax.optimization_barrier((acc, l, m_new, p))
        if cfg.pingpong:  # softmax done: wait for v, then for our turn on the tensor cores
            w.turns.ready()
            plgpu.barrier_wait(w.v_bar.at[slot])
            w.turns.take()
        else:
            plgpu.barrier_wait(w.v_bar.at[slot])
        acc = ops.pv(acc, p, w.v.at[slot], after_issue=lambda: w.wait_keys(j + 1))
        plgpu.barrier_arrive(w.v_free.at[slot])
        return acc, m_new, l

    carry = (ops.full((bq, d), 0.0), ops.full((bq,), -jnp.inf), ops.full((bq,), 0.0))
    for first, end, masked in w.ranges(w.lo):
        carry = lax.fori_loop(first, end, functools.partial(body, masked=masked), carry)
    return carry


def overlap_loops(w: Warpgroup):
    """FA3's intra-warpgroup overlap (needs lo < hi): block j's QK^T and block j-1's P.V issued
    together, block j's softmax while P.V is in flight, then the accumulator rescaled by block
    j's alpha (FA3's order at head dims <= 128). Returns (acc, m, l)."""
    cfg, ops = w.cfg, w.ops
    bq, d = w.q.shape[0], w.v.shape[-1]  # d: the accumulator's (v's) head dim

    def softmax(j, m, l, masked: bool):  # on_s: block j's logits -> m, l, p (float32), alpha
        def on_s(s):  # p stays float32 until P.V has landed: converting it now defines registers
            s = capped(cfg, s)
            if masked:  # the next wgmma reads while one is in flight (ptxas C7513, FA3's order)
                s = w.mask(s, w.slot(j))
            plgpu.barrier_arrive(w.k_free.at[w.slot(j)])
            out = softmax_stats(cfg, s, m, l, masked)
            if d <= 128:  # the softmax stays ahead of the wait for P.V
                out = lax.optimization_barrier(out)
            w.wait_keys(j + 1)
            return out

        return on_s

    def body(j, carry, masked: bool):
        acc, m, l, p = carry  # [bq, Dv] (scaled to m), [bq], [bq], [bq, bk] 16-bit (block j-1)
        prev = w.slot(j - 1)
        w.turns.turn()
        (m, l, p, alpha), acc = ops.qk_pv(
            w.q,
            w.k.at[w.slot(j)],
            (bq, cfg.bk),
            acc,
            p,
            w.v.at[prev],
            lambda: plgpu.barrier_wait(w.v_bar.at[prev]),
            w.turns.turn,
            softmax(j, m, l, masked),
        )
        plgpu.barrier_arrive(w.v_free.at[prev])
        return rescale(acc, alpha), m, l, p.astype(w.q.dtype)

    s = ops.qk(w.q, w.k.at[w.slot(w.lo)], (bq, cfg.bk), after_issue=w.turns.turn)  # block lo
    init = (ops.full((bq,), -jnp.inf), ops.full((bq,), 0.0))
    m, l, p, _ = softmax(w.lo, *init, w.masked)(s)
    carry = (ops.full((bq, d), 0.0), m, l, p.astype(w.q.dtype))
    for first, end, masked in w.ranges(w.lo + 1):
        carry = lax.fori_loop(first, end, functools.partial(body, masked=masked), carry)
    acc, m, l, p = carry
    last = w.slot(w.hi - 1)
    w.turns.turn()
    plgpu.barrier_wait(w.v_bar.at[last])
    acc = ops.pv(acc, p, w.v.at[last])
    plgpu.barrier_arrive(w.v_free.at[last])
    return acc, m, l
