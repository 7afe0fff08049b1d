"""Kernel body of the Pallas Mosaic GPU (Hopper) ring-step forward.

FlashAttention-3 (Shah et al. 2024) structure, written for sm_90: every CTA owns ``2 * bq`` query rows
of one (batch, query head) and runs three warpgroups. Warpgroups 0 and 1 compute (``bq`` rows each,
wgmma from shared memory, float32 online softmax in the log2 domain); warpgroup 2 is the producer and
streams the key/value blocks ``[lo, hi)`` of the step through a ring of ``stages`` shared-memory
slots with TMA, each slot guarded by a "loaded" barrier (TMA arrivals) and a "free" barrier (one
arrival per compute warpgroup). An optional schedule barrier makes the two compute warpgroups take
turns on the tensor cores (one's softmax overlaps the other's matmuls). The softmax takes the row
maximum of the unscaled logits, so each probability is one FMA and one ``exp2``; the next key
block is awaited while the current P·V product is in flight. ``FwdConfig.wgs == 3``
(``schedule="pingpong3"``) runs three compute warpgroups (``3 * bq`` rows, warpgroup 3 the
producer) that pass the tensor cores round a ring of barriers (``_Turns``), so each softmax
overlaps two other warpgroups' matmuls; the last CTA of a shard that ``3 * bq`` does not divide
ends at the shard's end and writes only the rows no CTA before it wrote (``cta_rows``). The
compute warpgroups' key-block loops (and FA3's intra-warpgroup overlap of one block's softmax
with the previous block's P·V, ``FwdConfig.overlap``) are in ``fwd_loops.py``.

Masking is the one of the Triton step (``triton/kernels.py``): the wrapper derives per-CTA block
bounds from ``masks.block_table``; blocks in ``[lo, mid)`` are fully visible and run without a mask,
blocks in ``[mid, hi)`` compare global positions (``k_pos <= q_pos``) and segment ids elementwise,
all other blocks are never loaded. Key positions / ids travel with their key block through TMA. A
sliding window (``|q_pos - k_pos| < window``) adds a bound ``edge``: blocks ``[lo, edge)`` at the
window's far edge run masked before the fully visible ones (without a window the kernel is as before).

Optional features (``implementations.py``), each a static ``FwdConfig`` field, off by default (the
kernel is then lowered exactly as without it): a soft cap (``softcap``: each logit pays one multiply
and one ``tanh.approx.f32``, ``fwd_loops.capped``; the row maximum of the tanh values is the
capped one, so the softmax stays one pass), a bidirectional prefix per batch row (``prefix``: one
scalar per CTA) and bidirectional segments (``bidirectional``): both relax the causal mask, whose
relaxed form is folded into a per-row limit (``causal_limit``), so partially visible blocks still
pay one compare per element for it (fully visible ones, prefix and bidirectional blocks included,
none: ``masks.block_table``). v may have its own head dim (``Dv``: v slots ``[S, bk, Dv]``, the
accumulator ``[bq, Dv]``).

A final o (``out_dtype`` = q's dtype, the lone step of a ring of one device or Ulysses) with v's
head dim equal to q's is written like FA3's epilogue: registers into the warpgroup's q slot (free
once its last q.k^T has landed), then one TMA store, awaited only until it has read the slot. A
float32 o (a ring step's partial result, twice the slot's bytes) and MLA's (``Dv != D``) are
stored from registers.

``Ops`` (``mosaic.py``) isolates the few operations that only exist on the device (wgmma through
accumulator refs, register layouts); with ``interpret=True`` they become plain ``jnp`` so the same
kernel, barriers and TMA pipeline run in Mosaic GPU's interpret mode on CPU. Shapes in comments:
``bq`` rows per compute warpgroup, ``bk`` keys per block, ``D`` the padded head dim, ``S`` stages.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ringattention.kernels.hopper import fwd_loops as hfl
from ringattention.kernels.hopper.mosaic import (
    LN2,
    FwdConfig,
    Ops,
    bound,
    set_registers,
    window_mask,
)


def causal_limit(cfg: FwdConfig, q_pos, q_seg, prefix):
    """int32 [bq]: the last key position each query row sees under the causal mask relaxed by
    ``prefix`` (a scalar: keys before it are visible) and ``bidirectional`` (rows of negative
    segments see every position), so the relaxed mask is one compare per element, like the plain
    one (``masks.visible``: kp <= qp or kp < prefix or q_seg < 0). None without either."""
    if not cfg.relaxed:
        return None
    if cfg.prefix:  # kp < prefix <=> kp <= prefix - 1 (prefix clamped so that it cannot wrap)
        lim = jnp.maximum(q_pos, jnp.maximum(prefix, jnp.int32(-(2**31) + 1)) - 1)
    else:
        lim = q_pos
    return jnp.where(q_seg < 0, jnp.int32(2**31 - 1), lim) if cfg.bidirectional else lim


def _mask(cfg: FwdConfig, ops: Ops, s, q_pos, q_seg, kpos_smem, kseg_smem, q_lim=None):
    """s [bq, bk] with hidden entries set to -inf (positions / ids: row vectors or SMEM refs;
    ``q_lim``: :func:`causal_limit`'s rows where the causal mask is relaxed)."""
    vis = None
    col = lambda ref: lax.broadcast_in_dim(ops.cols(ref), s.shape, [1])  # noqa: E731
    if cfg.causal:
        vis = col(kpos_smem) <= lax.broadcast_in_dim(q_pos if q_lim is None else q_lim, s.shape, [0])
    if cfg.window is not None:
        near = window_mask(
            cfg.causal and not cfg.relaxed,
            cfg.window,
            lax.broadcast_in_dim(q_pos, s.shape, [0]),
            col(kpos_smem),
        )
        vis = near if vis is None else vis & near
    if cfg.segments:
        same = col(kseg_smem) == lax.broadcast_in_dim(q_seg, s.shape, [0])
        vis = same if vis is None else vis & same
    return jnp.where(vis, s, -jnp.inf)


def cta_rows(wgs: int, qi, sq: int, bq: int):
    """(first row of CTA ``qi``'s query block, first row it owns or None). CTAs hold ``wgs * bq``
    rows; where that does not divide the (padded) shard length ``sq`` (three warpgroups: 192 rows)
    the last CTA ends at the shard's end and overlaps the one before it, whose rows it computes
    again but does not write (``sq`` is a multiple of ``bq``, so a warpgroup's rows are written
    whole or not at all)."""
    rows = wgs * bq
    if sq % rows == 0:
        return qi * rows, None
    return jnp.minimum(qi * rows, sq - rows), qi * rows


class _Turns:
    """The ping-pong: the compute warpgroups take turns issuing their products (FA3's warp
    scheduler barriers), so one's softmax runs while another's products use the tensor cores.

    Two warpgroups share one barrier of two arrivals: each hand-over is both arriving, so every
    phase pairs one's softmax with the other's products. Three (``cfg.wgs == 3``) pass a token
    round the ring of their barriers (one arrival each): a warpgroup waits on its own before it
    issues, and arrives on the next one's once it has issued, so each softmax overlaps the
    products of both others. Warpgroup 0 starts; the arrivals and waits of each barrier balance."""

    def __init__(self, cfg: FwdConfig, wg, sched):
        self.cfg, self.wg, self.sched = cfg, wg, sched

    def _mine(self):
        return self.sched.at[self.wg] if self.cfg.wgs > 2 else self.sched

    def turn(self):
        """After issuing: hand the tensor cores on (two warpgroups: and wait for the other's
        hand-over)."""
        if not self.cfg.pingpong:
            return
        if self.cfg.wgs > 2:
            plgpu.barrier_arrive(self.sched.at[lax.rem(self.wg + 1, jnp.int32(self.cfg.wgs))])
        else:
            plgpu.barrier_arrive(self.sched)
            plgpu.barrier_wait(self.sched)

    def ready(self):
        """The softmax is done (two warpgroups: the other may issue once it is done too)."""
        if self.cfg.wgs == 2:
            plgpu.barrier_arrive(self.sched)

    def take(self):
        """Wait for our turn to issue."""
        plgpu.barrier_wait(self._mine())

    def before(self):
        """Before the first product: every warpgroup but 0 waits for the one before it."""
        if self.cfg.wgs > 2:
            pl.when(self.wg > 0)(self.take)
        else:
            pl.when(self.wg == 1)(self.turn)

    def after(self):
        """After the last product: hand on to the next warpgroup (not past the last)."""
        if self.cfg.wgs > 2:
            pl.when(self.wg < self.cfg.wgs - 1)(self.turn)
        else:
            pl.when(self.wg == 0)(self.turn)


def fwd_kernel(*refs, cfg: FwdConfig):
    """Entry point for ``plgpu.kernel`` (grid axes "h", "i", "b"; warpgroup axis "wg").

    GMEM inputs: lo/mid/hi int32 [B, nq]; q [B, Sq, H, D]; k, v [B, Sk, K, D]; then (causal or
    window) q_pos [Sq], k_pos [Sk]; then (segments) q_seg [B, Sq], k_seg [B, Sk]; then (window) edge
    int32 [B, nq]; then (prefix) prefix int32 [B]. v may have its own head dim Dv: v [B, Sk, K, Dv].
    GMEM outputs: o f32 (or q's dtype where o is final) [B, Sq, H, Dv] (the step's layout: a
    warpgroup's tile is 64 rows of Dv contiguous values, H * Dv apart, and no transpose follows the
    kernel), lse f32 [B, H, Sq] (natural log).
    """
    n_in = 6 + 2 * cfg.positions + 2 * cfg.segments + (cfg.window is not None) + cfg.prefix
    ins, (o_ref, lse_ref), scratch = refs[:n_in], refs[n_in : n_in + 2], refs[n_in + 2 :]
    lo_ref, mid_ref, hi_ref, q_ref, k_ref, v_ref, *rest = ins
    qp_ref, kp_ref = (rest.pop(0), rest.pop(0)) if cfg.positions else (None, None)
    qs_ref, ks_ref = (rest.pop(0), rest.pop(0)) if cfg.segments else (None, None)
    edge_ref = rest.pop(0) if cfg.window is not None else None
    pf_ref = rest.pop(0) if cfg.prefix else None
    b, h, qi = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("i")
    if cfg.causal:  # the heaviest query blocks (latest positions) start first
        qi = cfg.nq - 1 - qi
    lo, mid, hi = bound(lo_ref[b, qi]), bound(mid_ref[b, qi]), bound(hi_ref[b, qi])
    g = dict(
        b=b,
        h=h,
        qi=qi,
        lo=lo,
        mid=mid,
        hi=hi,
        q_ref=q_ref,
        k_ref=k_ref,
        v_ref=v_ref,
        qp_ref=qp_ref,
        kp_ref=kp_ref,
        qs_ref=qs_ref,
        ks_ref=ks_ref,
        o_ref=o_ref,
        lse_ref=lse_ref,
    )
    if edge_ref is not None:
        g["edge"] = bound(edge_ref[b, qi])
    if pf_ref is not None:  # one scalar per CTA: its batch row's prefix
        g["prefix"] = bound(pf_ref[b])
    wg = lax.axis_index("wg")
    pl.when(wg < cfg.wgs)(lambda: _compute(cfg, wg, *scratch, **g))
    pl.when(wg == cfg.wgs)(lambda: _produce(cfg, *scratch, **g))


def _produce(
    cfg,
    q_smem,
    k_smem,
    v_smem,
    qpos_smem,
    kpos_smem,
    qseg_smem,
    kseg_smem,
    q_bar,
    k_bar,
    v_bar,
    k_free,
    v_free,
    sched,
    *,
    b,
    h,
    lo,
    hi,
    k_ref,
    v_ref,
    kp_ref,
    ks_ref,
    **_,
):
    """Producer warpgroup: TMA key/value blocks [lo, hi) into the slot ring."""
    set_registers(cfg.registers, compute=False, interpret=cfg.interpret, wgs=cfg.wgs)
    kvh = lax.div(h, jnp.int32(cfg.groups))

    def load(j, carry):
        t = j - lo
        slot = lax.rem(t, jnp.int32(cfg.stages))
        rows = pl.ds(j * cfg.bk, cfg.bk)

        @pl.when(t >= cfg.stages)
        def _():
            plgpu.barrier_wait(k_free.at[slot])

        plgpu.copy_gmem_to_smem(k_ref.at[b, rows, kvh], k_smem.at[slot], k_bar.at[slot])
        if cfg.positions:
            plgpu.copy_gmem_to_smem(kp_ref.at[rows], kpos_smem.at[slot], k_bar.at[slot])
        if cfg.segments:
            plgpu.copy_gmem_to_smem(ks_ref.at[b, rows], kseg_smem.at[slot], k_bar.at[slot])

        @pl.when(t >= cfg.stages)
        def _():
            plgpu.barrier_wait(v_free.at[slot])

        plgpu.copy_gmem_to_smem(v_ref.at[b, rows, kvh], v_smem.at[slot], v_bar.at[slot])
        return carry

    lax.fori_loop(lo, hi, load, None)

    def drain(j, carry):  # observe the last releases, so no barrier phase goes unseen
        slot = lax.rem(j - lo, jnp.int32(cfg.stages))
        plgpu.barrier_wait(k_free.at[slot])
        plgpu.barrier_wait(v_free.at[slot])
        return carry

    lax.fori_loop(jnp.maximum(lo, hi - cfg.stages), hi, drain, None)


def _load_queries(cfg, ops: Ops, src, dst, bar):
    """Loads a warpgroup's query rows (q, positions, ids: gmem slices ``src`` into its smem slots
    ``dst``; None when unused) and returns the positions and ids as row vectors [bq] (or None)."""
    for x, slot, on in zip(src, dst, (True, cfg.positions, cfg.segments), strict=True):
        if on:
            plgpu.copy_gmem_to_smem(x, slot, bar)
    plgpu.barrier_wait(bar)
    return (ops.rows(dst[1]) if cfg.positions else None), (ops.rows(dst[2]) if cfg.segments else None)


def _write(cfg, ops: Ops, q_slot, o_rows, lse_rows, acc, m, l):
    """o = acc / l (0 where a row sees nothing) into ``o_rows`` [bq, Dv] in its dtype, lse (natural
    log; -inf where nothing is seen) into ``lse_rows`` [bq]. o in q's dtype and shape (a final o)
    leaves through the warpgroup's q slot, free once the last q.k^T has landed, and one TMA store."""
    staged = o_rows.dtype == q_slot.dtype and acc.shape[1] == q_slot.shape[1]
    seen = l > 0.0
    inv = 1.0 / jnp.where(seen, l, 1.0)  # [bq]: one reciprocal per row, then multiplies
    o = (acc * lax.broadcast_in_dim(inv, acc.shape, [0])).astype(o_rows.dtype)
    if staged:
        ops.stage(q_slot, o)
        plgpu.copy_smem_to_gmem(q_slot, o_rows)
    else:
        ops.store(o_rows, o)  # float32, or q's where o is final
    lse_rows[...] = jnp.where(seen, m * LN2 - jnp.log(inv), -jnp.inf)
    if staged and not cfg.interpret:
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def _compute(
    cfg,
    wg,
    q_smem,
    k_smem,
    v_smem,
    qpos_smem,
    kpos_smem,
    qseg_smem,
    kseg_smem,
    q_bar,
    k_bar,
    v_bar,
    k_free,
    v_free,
    sched,
    *,
    b,
    h,
    qi,
    lo,
    mid,
    hi,
    q_ref,
    qp_ref,
    qs_ref,
    o_ref,
    lse_ref,
    edge=None,
    prefix=None,
    **_,
):
    """Compute warpgroup ``wg``: rows [row0, row0 + bq) of the CTA's query block."""
    set_registers(cfg.registers, compute=True, interpret=cfg.interpret, wgs=cfg.wgs)
    ops = Ops(cfg.interpret)
    bq, dv = q_smem.shape[1], v_smem.shape[2]  # dv: v's (padded) head dim, the accumulator's
    row0, owned = cta_rows(cfg.wgs, qi, q_ref.shape[1], bq)
    row0 = row0 + wg * bq
    rows = pl.ds(row0, bq)
    src = (
        q_ref.at[b, rows, h],
        qp_ref.at[rows] if cfg.positions else None,
        qs_ref.at[b, rows] if cfg.segments else None,
    )
    dst = (
        q_smem.at[wg],
        qpos_smem.at[wg] if cfg.positions else None,
        qseg_smem.at[wg] if cfg.segments else None,
    )
    q_pos, q_seg = _load_queries(cfg, ops, src, dst, q_bar.at[wg])
    q_lim = causal_limit(cfg, q_pos, q_seg, prefix)  # [bq] | None (prefix / bidirectional)

    turns = _Turns(cfg, wg, sched)

    def wait_keys(j):  # block j's keys: awaited while the previous block's PV is in flight
        @pl.when(j < hi)
        def _():
            plgpu.barrier_wait(k_bar.at[lax.rem(j - lo, jnp.int32(cfg.stages))])

    def mask(s, slot):  # s [bq, bk] with hidden entries -inf
        at = lambda ref: None if ref is None else ref.at[slot]  # noqa: E731
        return _mask(cfg, ops, s, q_pos, q_seg, at(kpos_smem), at(kseg_smem), q_lim)

    write = functools.partial(_write, cfg, ops, q_smem.at[wg], o_ref.at[b, rows, h], lse_ref.at[b, h, rows])
    ring = (k_smem, v_smem, k_bar, v_bar, k_free, v_free)  # the key / value slots and barriers
    w = hfl.Warpgroup(cfg, ops, q_smem.at[wg], *ring, turns, wait_keys, mask, lo, mid, hi, edge)
    if owned is not None:  # the last CTA's rows that the CTA before it has written are not written
        write = lambda *carry, write=write: pl.when(row0 >= owned)(lambda: write(*carry))  # noqa: E731
    wait_keys(lo)
    if not cfg.overlap:
        turns.before()
        carry = hfl.loops(w)
        turns.after()
        write(*carry)
        return

    @pl.when(lo < hi)  # the overlapped loop starts with block lo's QK^T
    def _():
        turns.before()
        carry = hfl.overlap_loops(w)
        turns.after()
        write(*carry)

    pl.when(lo >= hi)(lambda: write(ops.full((bq, dv), 0.0), ops.full((bq,), -jnp.inf), ops.full((bq,), 0.0)))
