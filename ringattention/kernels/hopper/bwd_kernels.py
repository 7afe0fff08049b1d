"""Kernel bodies of the Pallas Mosaic GPU (Hopper) ring-step backward: dq and dk/dv.

FlashAttention-2/3 backward (Dao 2023; Shah et al. 2024) with the forward's structure
(``fwd_kernel.py``): per CTA two compute warpgroups own 64 rows each (query rows for dq, key rows
for dk/dv) and a producer warpgroup streams the other side's blocks through a ring of shared-memory
slots with TMA. Probabilities are recomputed from the ring's *global* lse (log2 units, 0 where a row
sees nothing) and ``delta = rowsum(o * do)``; the same lo/mid/hi bounds as the forward decide which
blocks are skipped, run unmasked or run with the position / segment mask (with a sliding window a
fourth bound, ``edge``, puts the blocks at the window's far edge in a masked range first).

* dq (grid: query head, query CTA, batch): ``dq = scale * sum_j ds_j @ k_j`` over key blocks j.
* dk/dv (grid: kv head, key CTA, batch): loops over the G query heads of the group and the query
  blocks (last to first, so a causal CTA runs its diagonal blocks masked at the end, and starting
  at a block rotated by the CTA index: ``visit``), so GQA neither repeats k/v nor writes
  per-query-head partial sums:
  ``dv = sum p^T @ do``, ``dk = scale * sum ds^T @ q`` (computed transposed, keys as rows).
  Its producer, key loading and tile (``query_issuer``, ``load_keys``, ``kv_probs``) are shared with
  the fused backward (``fused_bwd.py``); the configuration, masks and block loops of every
  backward kernel are ``bwd_common.py``'s.

Per block pair the two products that read only shared memory (s and dp) are issued together and
the probabilities computed while the second is in flight; the two register-operand products (dk
and dv) are issued together too (``Ops.pair``, ``Ops.mma``).

Optional features (``implementations.py``), each a static ``BwdConfig`` field, off by default,
when the kernels are those without it: ``softcap`` (the capped logit recomputed with one tanh per
element, ``log2_logits``; ``ds`` times ``1 - tanh**2``, ``capped``), ``prefix`` (one int32 per batch
row, the kernels' last input, read as a scalar by the compute warpgroups) and ``bidirectional``;
both of these are folded into the causal comparison's positions (``causal_rows``), the block table
having already made the blocks they open up fully visible (unmasked). v may have its own head dim
``Dv`` (do, dv too): every shape is read from the buffers.

Shapes in comments: ``r`` own rows per warpgroup, ``c`` streamed block length, ``D`` padded head dim
(``Dv`` v's).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ringattention.kernels.hopper.bwd_common import (
    BwdConfig,
    block_loops,
    capped,
    causal_rows,
    compute_ops,
    cta_index,
    log2_logits,
    nothing_masked,
    query_probs,
    row_prefix,
    split_refs,
    stream,
    visibility,
    visit,
)
from ringattention.kernels.hopper.mosaic import COMPUTE_WGS, Ops, Smem


def _load_queries(cfg: BwdConfig, ops: Ops, wg, gmem, smem, bar):
    """Loads warpgroup ``wg``'s own query rows (q, do, lse2, delta, positions, ids: gmem slices and
    smem buffers, None when unused) and returns lse2, delta, positions, ids as row vectors."""
    for src, dst in zip(gmem, smem, strict=True):
        if dst is not None:
            plgpu.copy_gmem_to_smem(src, dst.at[wg], bar)
    plgpu.barrier_wait(bar)
    _, _, lse_s, dl_s, qp_s, qs_s = smem
    lse, delta = ops.rows(lse_s.at[wg]), ops.rows(dl_s.at[wg])  # [r]
    own_pos = ops.rows(qp_s.at[wg]) if cfg.positions else None
    own_seg = ops.rows(qs_s.at[wg]) if cfg.segments else None
    return lse, delta, own_pos, own_seg


def dq_kernel(*refs, cfg: BwdConfig):
    """Grid ("h", "i", "b"), warpgroups "wg". GMEM: lo/mid/hi [B, nq]; q [B, Sq, H, D], do
    [B, Sq, H, Dv]; k [B, Sk, K, D], v [B, Sk, K, Dv]; lse2, delta f32 [B, H, Sq]; positions / ids
    as in the forward; [edge]; [prefix int32 [B]]. Out: dq f32 [B, Sq, H, D] (the step's layout: no
    transpose after the kernel)."""
    bounds, gmem, (qp_ref, kp_ref), (qs_ref, ks_ref), (dq_ref,), scratch = split_refs(refs, cfg, 1)
    q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref = gmem
    (q_s, do_s, lse_s, dl_s, qp_s, qs_s, k_s, v_s, kp_s, ks_s, own_bar, loaded, free) = scratch
    b, i, bounds = cta_index(cfg, bounds, reverse=cfg.causal)
    lo, hi = bounds[0], bounds[2]
    h, wg = lax.axis_index("h"), lax.axis_index("wg")
    kvh = lax.div(h, jnp.int32(cfg.groups))
    r, c = cfg.rows, cfg.block

    @pl.when(wg == COMPUTE_WGS)
    def _():
        issue = key_issuer(cfg, b, kvh, lo, (k_ref, v_ref, kp_ref, ks_ref), (k_s, v_s, kp_s, ks_s))
        stream(cfg, hi - lo, issue, loaded, free)

    @pl.when(wg < COMPUTE_WGS)
    def _():
        ops = compute_ops(cfg)
        rows = pl.ds(i * (COMPUTE_WGS * r) + wg * r, r)
        own_rows = (
            q_ref.at[b, rows, h],
            do_ref.at[b, rows, h],
            lse_ref.at[b, h, rows],
            dl_ref.at[b, h, rows],
            qp_ref.at[rows] if cfg.positions else None,
            qs_ref.at[b, rows] if cfg.segments else None,
        )
        own_smem = (q_s, do_s, lse_s, dl_s, qp_s, qs_s)
        lse, delta, *own = _load_queries(cfg, ops, wg, own_rows, own_smem, own_bar.at[wg])
        own = (*own, causal_rows(cfg, *own, row_prefix(refs, cfg, b), True))

        def body(j, dq, masked: bool):
            slot = lax.rem(j - lo, jnp.int32(cfg.stages))
            plgpu.barrier_wait(loaded.at[slot])
            at = lambda ref: None if ref is None else ref.at[slot]  # noqa: E731
            keys = (at(kp_s), at(ks_s))
            probs = functools.partial(query_probs, cfg, ops, lse=lse, own=own, keys=keys, masked=masked)
            # s = q k^T and dp = do v^T issued together; p is computed while dp is in flight.
            p, dp = ops.pair(
                (Smem(q_s.at[wg]), Smem(k_s.at[slot], transposed=True)),
                (Smem(do_s.at[wg]), Smem(v_s.at[slot], transposed=True)),
                (r, c),
                probs,
            )
            ds = p * (dp - lax.broadcast_in_dim(delta, dp.shape, [0]))  # [r, c]
            (dq,) = ops.mma((dq, ds.astype(q_s.dtype), Smem(k_s.at[slot])))
            plgpu.barrier_arrive(free.at[slot])
            return dq

        dq = block_loops(body, bounds, cfg.masked, ops.full((r, q_s.shape[2]), 0.0))  # slots from lo
        dq_ref.at[b, rows, h][...] = dq * cfg.scale


def key_issuer(cfg: BwdConfig, b, kvh, lo, gmem, smem):
    """Producer callback of the dq kernels: stream t loads key block lo + t (k, v, positions, ids;
    gmem refs and smem slot rings, positions and ids None when unused)."""
    (k_ref, v_ref, kp_ref, ks_ref), (k_s, v_s, kp_s, ks_s) = gmem, smem

    def issue(t, slot, bar):
        cols = pl.ds((lo + t) * cfg.block, cfg.block)
        for src, dst in (
            (k_ref.at[b, cols, kvh], k_s),
            (v_ref.at[b, cols, kvh], v_s),
            (kp_ref.at[cols] if cfg.positions else None, kp_s),
            (ks_ref.at[b, cols] if cfg.segments else None, ks_s),
        ):
            if src is not None:
                plgpu.copy_gmem_to_smem(src, dst.at[slot], bar)

    return issue


def query_issuer(cfg: BwdConfig, b, kvh, bounds, shift, gmem, smem):
    """Producer callback of the key-CTA kernels: stream t loads query block ``visit(lo + t % n)``
    of query head ``kvh * G + t // n`` (n = hi - lo). gmem: (q, do, lse2, delta, q_pos, q_seg)
    refs (None when unused); smem: their slot rings."""
    q_ref, do_ref, lse_ref, dl_ref, qp_ref, qs_ref = gmem
    lo, _, hi = bounds[:3]
    n = hi - lo

    def issue(t, slot, bar):
        g = lax.div(t, n)
        blk = visit(lo + lax.rem(t, n), bounds, shift, q_ref.shape[1] // cfg.block)
        h = kvh * cfg.groups + g
        cols = pl.ds(blk * cfg.block, cfg.block)
        srcs = (
            q_ref.at[b, cols, h],
            do_ref.at[b, cols, h],
            lse_ref.at[b, h, cols],
            dl_ref.at[b, h, cols],
            qp_ref.at[cols] if cfg.positions else None,
            qs_ref.at[b, cols] if cfg.segments else None,
        )
        for src, dst in zip(srcs, smem, strict=True):
            if dst is not None:
                plgpu.copy_gmem_to_smem(src, dst.at[slot], bar)

    return issue


def load_keys(cfg: BwdConfig, ops: Ops, b, kvh, wg, rows, gmem, smem, bar, prefix=None):
    """Loads warpgroup ``wg``'s own key rows (k, v, positions, ids; gmem/smem 4-tuples) and returns
    the key positions, ids (row vectors, None when unused) and their ``causal_rows`` (``prefix``:
    the batch row's, ``row_prefix``)."""
    (k_ref, v_ref, kp_ref, ks_ref), (k_s, v_s, kp_s, ks_s) = gmem, smem
    for src, dst in (
        (k_ref.at[b, rows, kvh], k_s),
        (v_ref.at[b, rows, kvh], v_s),
        (kp_ref.at[rows] if cfg.positions else None, kp_s),
        (ks_ref.at[b, rows] if cfg.segments else None, ks_s),
    ):
        if dst is not None:
            plgpu.copy_gmem_to_smem(src, dst.at[wg], bar)
    plgpu.barrier_wait(bar)
    own_pos = ops.rows(kp_s.at[wg]) if cfg.positions else None
    own_seg = ops.rows(ks_s.at[wg]) if cfg.segments else None
    return own_pos, own_seg, causal_rows(cfg, own_pos, own_seg, prefix, queries=False)


def kv_probs(cfg: BwdConfig, ops: Ops, wg, slot, own, smem, masked: bool, columns_first: bool = False):
    """One (own key rows, streamed query block) pair: p^T and ds^T, float32 [r keys, c queries], 0
    where hidden or the row sees nothing (with a soft cap p^T is 16-bit, as dv's wgmma reads it,
    so that it and the float32 p^T (1 - t^2) are what stays live while dp^T is in flight). own:
    ``load_keys``' (key positions, ids, causal positions); smem: (k, v, q, do, lse2, delta, q_pos,
    q_seg) refs.

    lse2 and delta of the streamed queries are column vectors here (16 values per thread each at
    c = 64). ``columns_first`` loads them before the two wgmmas are issued instead of after they
    land: the dk/dv kernel's choice (its backward step 4-8% faster on an H200), not the fused
    kernels', which carry a dq tile as well and lost 4-28% with it
    (docs/kernels.md).

    Where dk and dv outgrow 256 columns (MLA's 192 + 128: 160 float32 registers per thread), s^T
    and dp^T run one after the other, dp^T's accumulator starting at -delta: both in flight made
    ptxas serialize every wgmma of the fused kernel (C7512, 780 / 984 bytes of spills), one at a
    time it does not (444 / 648; docs/kernels.md)."""
    k_s, v_s, q_s, do_s, lse_s, dl_s, qp_s, qs_s = smem
    shape = (cfg.rows, cfg.block)
    col = lambda ref: ops.cols(ref.at[slot])  # noqa: E731
    wide = lambda x: lax.broadcast_in_dim(x, shape, [1])  # noqa: E731
    early = (col(lse_s), col(dl_s)) if columns_first else None  # [c] each

    def probs(s_t):  # raw logits [r, c] -> probabilities (and with a soft cap p^T (1 - t^2))
        x, t = log2_logits(cfg, s_t)
        p_t = jnp.exp2(x - wide(early[0] if columns_first else col(lse_s)))
        if masked:
            at = lambda ref: None if ref is None else ref.at[slot]  # noqa: E731
            p_t = jnp.where(visibility(cfg, ops, s_t.shape, own, at(qp_s), at(qs_s), False), p_t, 0.0)
        return p_t if t is None else (p_t.astype(k_s.dtype), capped(p_t, t))

    delta = lambda: wide(early[1] if columns_first else col(dl_s))  # noqa: E731
    if k_s.shape[2] + v_s.shape[2] > 2 * 128:  # MLA: dk, dv hold 160 registers per thread
        # s^T, then dp^T - delta (its accumulator starts at -delta): one accumulator at a time
        p_t = probs(ops.qk(k_s.at[wg], q_s.at[slot], shape))
        p_t, g_t = (p_t, p_t) if cfg.softcap is None else p_t
        (dp_t,) = ops.mma((-delta(), Smem(v_s.at[wg]), Smem(do_s.at[slot], transposed=True)))
        return p_t, g_t * dp_t
    # s^T = k q^T and dp^T = v do^T issued together; p^T is computed while dp^T is in flight
    p_t, dp_t = ops.pair(
        (Smem(k_s.at[wg]), Smem(q_s.at[slot], transposed=True)),
        (Smem(v_s.at[wg]), Smem(do_s.at[slot], transposed=True)),
        shape,
        probs,
    )
    p_t, g_t = (p_t, p_t) if cfg.softcap is None else p_t
    return p_t, g_t * (dp_t - delta())


def kv_update(ops: Ops, carry, p_t, ds_t, q_smem, do_smem):
    """dk += ds^T q, dv += p^T do (float32 [r, D], [r, Dv]), issued together; ds^T, p^T in
    registers."""
    dk, dv = carry
    dv, dk = ops.mma(
        (dv, p_t.astype(q_smem.dtype), Smem(do_smem)), (dk, ds_t.astype(q_smem.dtype), Smem(q_smem))
    )
    return dk, dv


def group_loop(cfg, ops, body, bounds, masked: bool, d: int, out_refs, dv: int | None = None) -> None:
    """dk/dv of one warpgroup's own keys: ``body(j, (dk, dv), g, masked)`` over query block j in
    [lo, mid) unmasked then [mid, hi) masked, for each query head g of the kv group; writes dk (scaled)
    [r, d] and dv [r, dv] (None: d) to ``out_refs``. With a window (bounds lo, mid, hi, edge):
    [lo, edge) masked first, then [edge, mid) unmasked. Without any mask, one flat loop over the
    group's (head, block) pairs in the same order (a loop nest carries dk and dv through every
    level: more registers)."""

    def head(g, carry):  # query head kvh * G + g: full blocks, then masked ones
        return block_loops(functools.partial(body, g=g), bounds, masked, carry)

    def pair(t, carry):  # the t-th pair over the group's heads, none masked
        g, j = lax.div(t, n), lo + lax.rem(t, n)  # n > 0 whenever a pair exists
        return body(j, carry, g=g, masked=False)

    zeros = ops.full((cfg.rows, d), 0.0)
    zeros_v = zeros if dv in (None, d) else ops.full((cfg.rows, dv), 0.0)
    lo, n = bounds[0], bounds[2] - bounds[0]
    if cfg.groups == 1:
        dk, dv = head(jnp.int32(0), (zeros, zeros_v))
    elif nothing_masked(bounds, masked):  # one flat loop: no loop nest carrying dk, dv
        dk, dv = lax.fori_loop(0, cfg.groups * n, pair, (zeros, zeros_v))
    else:
        dk, dv = lax.fori_loop(0, cfg.groups, head, (zeros, zeros_v))
    dk_ref, dv_ref = out_refs
    dk_ref[...] = dk * cfg.scale
    dv_ref[...] = dv


def dkv_kernel(*refs, cfg: BwdConfig):
    """Grid ("h", "i", "b") over kv heads and key CTAs. Inputs as ``dq_kernel`` (lo/mid/hi [B, nk]
    over query blocks). Out: dk f32 [B, Sk, K, D], dv f32 [B, Sk, K, Dv]."""
    bounds, gmem, (qp_ref, kp_ref), (qs_ref, ks_ref), (dk_ref, dv_ref), scratch = split_refs(refs, cfg, 2)
    q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref = gmem
    (k_s, v_s, kp_s, ks_s, q_s, do_s, lse_s, dl_s, qp_s, qs_s, own_bar, loaded, free) = scratch
    b, i, bounds = cta_index(cfg, bounds, reverse=False)  # causal: early keys are the heaviest
    lo, mid, hi = bounds[:3]
    kvh, wg = lax.axis_index("h"), lax.axis_index("wg")
    n = hi - lo  # query blocks per head of the group
    slots = (q_s, do_s, lse_s, dl_s, qp_s, qs_s)
    issue = query_issuer(cfg, b, kvh, bounds, i, (q_ref, do_ref, lse_ref, dl_ref, qp_ref, qs_ref), slots)

    @pl.when(wg == COMPUTE_WGS)
    def _():
        stream(cfg, n * cfg.groups, issue, loaded, free)

    @pl.when(wg < COMPUTE_WGS)
    def _():
        ops = compute_ops(cfg)
        rows = pl.ds(i * (COMPUTE_WGS * cfg.rows) + wg * cfg.rows, cfg.rows)
        gmem, smem = (k_ref, v_ref, kp_ref, ks_ref), (k_s, v_s, kp_s, ks_s)
        own = load_keys(cfg, ops, b, kvh, wg, rows, gmem, smem, own_bar.at[wg], row_prefix(refs, cfg, b))
        smem = (k_s, v_s, q_s, do_s, lse_s, dl_s, qp_s, qs_s)
        masked = cfg.masked

        def body(j, carry, g, masked: bool):
            slot = lax.rem(g * n + j - lo, jnp.int32(cfg.stages))
            plgpu.barrier_wait(loaded.at[slot])
            p_t, ds_t = kv_probs(cfg, ops, wg, slot, own, smem, masked, columns_first=True)  # [r, c]
            carry = kv_update(ops, carry, p_t, ds_t, q_s.at[slot], do_s.at[slot])
            plgpu.barrier_arrive(free.at[slot])
            return carry

        outs = (dk_ref.at[b, rows, kvh], dv_ref.at[b, rows, kvh])
        group_loop(cfg, ops, body, bounds, masked, k_s.shape[2], outs, v_s.shape[2])
