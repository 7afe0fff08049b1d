"""What the Hopper ring-step backward kernels share: their configuration and mask plumbing.

The FlashAttention-2/3 backward (Dao 2023; Shah et al. 2024) recomputes each block pair's
probabilities from the ring's global lse; every kernel of this package (``bwd_kernels.py``,
``fused_bwd.py``, ``cta_dq_bwd.py``, ``split_bwd.py``) decides which block pairs it visits, and how
it masks them, the same way. This module holds that part:

* ``BwdConfig``, the static configuration, and ``split_refs``, which names a kernel's inputs;
* ``cta_index`` and ``stream``: the CTA's batch row, index and bounds, and the producer loop;
* the elementwise mask of a partially visible block (``visibility``; ``causal_rows`` folds a
  bidirectional prefix or segment into the causal comparison's positions; ``row_prefix``);
* the soft cap's logits and gradient factor (``log2_logits``, ``capped``);
* the block loops (``block_loops``: with a window, the far edge masked first, then the fully
  visible blocks, then the masked diagonal) and the key CTAs' visiting order (``visit``,
  ``key_cta_bounds``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ringattention.kernels import common
from ringattention.kernels.hopper.mosaic import LOG2E, Ops, bound, set_registers, window_mask

INT_MAX, INT_MIN = 2**31 - 1, -(2**31)  # causal positions seen by / seeing every position


@dataclasses.dataclass(frozen=True)
class BwdConfig:
    rows: int  # own rows per compute warpgroup
    block: int  # streamed block length
    stages: int
    causal: bool
    segments: bool
    groups: int  # query heads per kv head
    n_cta: int  # CTAs along the own axis
    qk_scale: float  # softmax_scale * log2(e)
    scale: float
    interpret: bool
    registers: int = 232  # per compute-warpgroup thread (mosaic.REGISTER_CHOICES)
    window: int | None = None  # sliding window: |q_pos - k_pos| >= window is hidden
    softcap: float | None = None  # logits C * tanh(scale * q.k / C) (Gemma 2)
    prefix: bool = False  # a bidirectional prefix per batch row (int32 [B], the last input)
    bidirectional: bool = False  # queries of negative segments see their whole segment

    @property
    def widened(self) -> bool:
        """Whether the causal comparison reads positions widened by a prefix or bidirectional
        segments (``causal_rows``)."""
        return self.prefix or self.bidirectional

    @property
    def positions(self) -> bool:
        """Whether positions are loaded (causal masks and windows compare them)."""
        return self.causal or self.window is not None

    @property
    def masked(self) -> bool:
        """Whether partially visible blocks need an elementwise mask."""
        return self.causal or self.segments or self.window is not None


def n_inputs(cfg: BwdConfig) -> int:
    return 9 + 2 * cfg.positions + 2 * cfg.segments + (cfg.window is not None) + cfg.prefix


def split_refs(refs, cfg: BwdConfig, n_out: int):
    """Inputs lo, mid, hi, q, k, v, do, lse, delta, [q_pos, k_pos], [q_seg, k_seg], [edge],
    [prefix] (``row_prefix`` reads the last)."""
    n_in = n_inputs(cfg)
    ins, outs, scratch = refs[:n_in], refs[n_in : n_in + n_out], refs[n_in + n_out :]
    lo, mid, hi, q, k, v, do, lse, delta, *rest = ins
    pos = (rest.pop(0), rest.pop(0)) if cfg.positions else (None, None)
    seg = (rest.pop(0), rest.pop(0)) if cfg.segments else (None, None)
    bounds = (lo, mid, hi, rest.pop(0)) if cfg.window is not None else (lo, mid, hi)
    return bounds, (q, k, v, do, lse, delta), pos, seg, outs, scratch


def cta_index(cfg: BwdConfig, bounds, reverse: bool):
    b, i = lax.axis_index("b"), lax.axis_index("i")
    if reverse:  # causal dq: the latest query blocks see the most keys; start them first
        i = cfg.n_cta - 1 - i
    return b, i, tuple(bound(ref[b, i]) for ref in bounds)


def stream(cfg: BwdConfig, n, issue, loaded, free):
    """Producer: for t in [0, n) wait for slot t % stages to be free and ``issue(t, slot, barrier)``."""
    set_registers(cfg.registers, compute=False, interpret=cfg.interpret)

    def load(t, carry):
        slot = lax.rem(t, jnp.int32(cfg.stages))

        @pl.when(t >= cfg.stages)
        def _():
            plgpu.barrier_wait(free.at[slot])

        issue(t, slot, loaded.at[slot])
        return carry

    lax.fori_loop(0, n, load, None)

    def drain(t, carry):  # observe the last releases
        plgpu.barrier_wait(free.at[lax.rem(t, jnp.int32(cfg.stages))])
        return carry

    lax.fori_loop(jnp.maximum(0, n - cfg.stages), n, drain, None)


def row_prefix(refs, cfg: BwdConfig, b):
    """The batch row's prefix, an int32 scalar read from the last input; None without one."""
    return refs[n_inputs(cfg) - 1][b] if cfg.prefix else None


def causal_rows(cfg: BwdConfig, pos, seg, prefix, queries: bool):
    """The own rows' positions as the causal comparison reads them (``masks.visible``): a query at
    q sees a key at k if k <= q, or k < prefix, or its segment id is negative, i.e. if
    k <= max(q, prefix - 1), or always (INT_MAX); a key below the prefix is seen by every query
    (INT_MIN). ``pos``, ``seg``: row vectors (None when unused); ``prefix``: a scalar (the wrapper
    keeps it above INT_MIN) or None. Without either feature ``pos`` itself (no operation). Queries
    streamed as columns are widened per block (``visibility``)."""
    if not (cfg.causal and cfg.widened):
        return pos
    if queries:
        if prefix is not None:
            pos = jnp.maximum(pos, prefix - 1)
        return jnp.where(seg < 0, INT_MAX, pos) if cfg.bidirectional else pos
    return pos if prefix is None else jnp.where(pos < prefix, INT_MIN, pos)


def visibility(cfg, ops, shape, own, pos_ref, seg_ref, own_is_query: bool):
    """bool [r, c] visibility (own rows x streamed columns), or None when nothing masks. own: the
    own rows' (positions, ids, ``causal_rows``)."""
    own_pos, own_seg, own_causal = own
    col = lambda x: lax.broadcast_in_dim(x, shape, [1])  # noqa: E731
    row = lambda x: lax.broadcast_in_dim(x, shape, [0])  # noqa: E731
    seg_cols = ops.cols(seg_ref) if cfg.bidirectional and not own_is_query else None  # read once
    vis = None
    if cfg.causal:
        if own_is_query:
            vis = col(ops.cols(pos_ref)) <= row(own_causal)
        else:  # streamed queries: those of negative segments see every position
            keys = row(own_causal)
            q_cols = ops.cols(pos_ref)
            if seg_cols is not None:
                q_cols = jnp.where(seg_cols < 0, INT_MAX, q_cols)
            vis = keys <= col(q_cols)
    if cfg.window is not None:
        if own_is_query:
            q_pos, k_pos = row(own_pos), col(ops.cols(pos_ref))
        else:
            q_pos, k_pos = col(ops.cols(pos_ref)), row(own_pos)
        # one-sided where the causal mask covers the other side: not where it is widened
        near = window_mask(cfg.causal and not cfg.widened, cfg.window, q_pos, k_pos)
        vis = near if vis is None else vis & near
    if cfg.segments:
        same = col(ops.cols(seg_ref) if seg_cols is None else seg_cols) == row(own_seg)
        vis = same if vis is None else vis & same
    return vis


def log2_logits(cfg: BwdConfig, s):
    """Raw logits q.k (float32 [r, c]) -> the scaled logits in log2 units, and None; with a soft cap
    C the capped ones, C log2(e) tanh(scale q.k / C), and the tanh (one per element, approximate on
    the device: ``CompilerParams(approx_math=True)``) for ``capped``."""
    if cfg.softcap is None:
        return s * cfg.qk_scale, None
    t = jnp.tanh(s * (cfg.scale / cfg.softcap))
    return t * (cfg.softcap * LOG2E), t


def query_probs(cfg: BwdConfig, ops: Ops, s, *, lse, own, keys, masked: bool):
    """The dq kernels' raw logits s [own query rows, streamed keys] -> probabilities (with a soft
    cap times 1 - tanh^2, ``capped``), 0 where hidden. lse: the own rows' (log2 units); own: their
    (positions, ids, ``causal_rows``); keys: the slot's key positions and ids (None when unused)."""
    x, t = log2_logits(cfg, s)
    p = jnp.exp2(x - lax.broadcast_in_dim(lse, s.shape, [0]))
    if masked:
        p = jnp.where(visibility(cfg, ops, s.shape, own, *keys, True), p, 0.0)
    return capped(p, t)


def capped(p, t):
    """What multiplies ``dp - delta`` in ds: p, or with a soft cap (tanh t) p (1 - t^2)."""
    return p if t is None else p * (1.0 - t * t)


def compute_ops(cfg):
    set_registers(cfg.registers, compute=True, interpret=cfg.interpret)
    return Ops(cfg.interpret)


def nothing_masked(bounds, masked: bool) -> bool:
    """No causal mask, segment ids or window (whose bounds carry a fourth entry, the far edge)."""
    return not masked and len(bounds) == 3


def block_loops(body, bounds, masked: bool, carry):
    """``carry = body(j, carry, masked=...)`` over the visited blocks j: with a window (bounds lo,
    mid, hi, edge) [lo, edge) at the window's far edge masked first; then [lo or edge, mid) fully
    visible, unmasked; then [mid, hi) (diagonal, segment boundaries) masked if ``masked``."""
    lo, mid, hi = bounds[:3]
    if nothing_masked(bounds, masked):  # one loop (one copy of the body)
        return lax.fori_loop(lo, hi, functools.partial(body, masked=False), carry)
    start = lo
    if len(bounds) == 4:  # the window's far edge
        carry = lax.fori_loop(lo, bounds[3], functools.partial(body, masked=True), carry)
        start = bounds[3]
    carry = lax.fori_loop(start, mid, functools.partial(body, masked=False), carry)
    return lax.fori_loop(mid, hi, functools.partial(body, masked=masked), carry)


def visit(j, bounds, shift, n_blocks: int):
    """The query block a key CTA visits at position j of [lo, hi). Key CTAs walk the query blocks
    backwards (the bounds index the reversed order, ``key_cta_bounds``), so a causal CTA meets its
    fully visible blocks first and its diagonal (masked) blocks last; the unmasked positions
    [lo, mid) are rotated by ``shift`` (the key CTA's index), so that CTAs running side by side send
    their dq contributions to different query rows instead of all starting at the same block. With
    a window (``bounds`` lo, mid, hi, edge) the rotation is that of the unmasked [edge, mid)."""
    if len(bounds) == 4:
        edge, mid = bounds[3], bounds[1]
        full = jnp.maximum(mid - edge, 1)
        rotated = (j >= edge) & (j < mid)
        return n_blocks - 1 - jnp.where(rotated, edge + lax.rem(j - edge + shift, full), j)
    lo, mid, _ = bounds
    full = jnp.maximum(mid - lo, 1)
    r = jnp.where(j < mid, lo + lax.rem(j - lo + shift, full), j)  # reversed block index
    return n_blocks - 1 - r


def key_cta_bounds(table, batch: int, window: int | None = None):
    """lo/mid/hi (and with a window, edge) int32 [B, nk] of each key CTA over the *reversed* query
    blocks, from a SKIP/PARTIAL/FULL table [B|1, nq, nk] (``visit`` maps positions back to
    blocks)."""
    reversed_table = jnp.flip(jnp.swapaxes(table, 1, 2), axis=2)
    if window is None:
        return common.bounds(reversed_table, batch)
    return common.edge_bounds(reversed_table, batch)
