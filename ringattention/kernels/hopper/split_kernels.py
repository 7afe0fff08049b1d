"""Kernel bodies of the Pallas Mosaic GPU (Hopper) ring-step backward above head dim 128: the head
dim split in two (the wrapper, padding and launches: ``split_bwd.py``).

The FlashAttention-3 backward (Shah et al. 2024; its head-dim-256 configuration) for one step of
Ring Attention (Liu, Zaharia & Abbeel 2023), for head dims that pad to more than 128
(``cta_dq_bwd.py`` does not fit there: each warpgroup would hold dk and dv of its 64 keys,
[64, 256] float32 each, 256 registers per thread): ``pallas_hopper.BlockSizes(backward="mosaic")``,
the default and the only Mosaic backward there, runs two deterministic kernels.

``split_kernel`` (dk, dv): the two compute warpgroups of a CTA *share* its 64 keys (grid: kv head,
key CTA, batch) and split the work of every (key block, query block) pair without doing any of it
twice:

* s^T = k q^T and dp^T = v do^T: warpgroup w takes the 32 queries [32w, 32w + 32) of the streamed
  64-query block (wgmma [64 keys, 32 queries], contracting the whole head dim), and writes its half
  of p^T and ds^T (16-bit) to one shared [64 keys, 64 queries] tile each;
* after a barrier, dv[:, Dw] += p^T do[:, Dw] and dk[:, Dw] += ds^T q[:, Dw] over its 128 head-dim
  columns Dw = [128w, 128w + 128).

The query blocks are visited in the order of the key-CTA kernels (``bwd_common.visit``:
reversed, rotated by the CTA index) and the GQA group loop is theirs (``group_loop``).
``dq_kernel``'s CTAs own 64 query rows shared by the two warpgroups the same way (s and dp split by
keys, ds through shared memory, dq[:, Dw] kept in registers and written once): 7 tile products per
pair, no atomics, every output element written by one warpgroup after a loop in a fixed order.
(A fused variant, ``split_kernel`` also adding dq[:, Dw] = ds k[:, Dw] by per-element atomics, 5
tile products per pair, ran 2.2x slower on an H200 and was deleted: docs/kernels.md, "Tried and
lost".)

Masks as in ``bwd_common``: blocks outside the causal mask, the segments or a sliding window
are never loaded; with a window (``window=W``) both kernels take the ``edge`` bound as their last
input and run the blocks at the window's far edge masked before the fully visible ones, and
positions are loaded whenever a window is set. Without a window the kernels are unchanged. The
optional features (softcap, prefix, bidirectional) are ``bwd_common``'s (``BwdConfig``).

v's own head dim (MLA: 192 for q/k, 128 for v): q, k and v, do are padded separately, each to
a multiple of 64 (``split_bwd.padded_dims``: 192 stays 192, where padding it to 256 would add a
third to the q/k products); the warpgroups split dk's, dq's columns in halves of D and dv's in halves of Dv
(``[64, 96]`` and ``[64, 64]`` float32 at 192 / 128: 80 registers per thread against 128 at 256),
and s^T contracts D, dp^T Dv. Without a head dim of v's own both stay padded to 256, as timed on
the device.

Budgets (bf16/fp16, D = 256, per CTA of 2 compute warpgroups + 1 producer):

* shared memory (``smem_bytes``, the larger of the dk/dv and dq kernels'): own k, v 2 x 32 KB;
  per stage q, do 2 x 32 KB (+ 1 KB of lse,
  delta, positions, ids); p^T, ds^T 2 x 8 KB; with 2 stages 210.5 KB of the 227 KB (214 KB as Mosaic
  GPU allocates it, with barriers and alignment; 3 stages: 274 KB, rejected by the wrapper);
* registers per compute thread of ``split_kernel`` (128 threads, float32 [64, n] = n / 2
  registers): dk, dv [64, 128] 64 + 64; s^T, dp^T [64, 32] 16 + 16 while p^T / ds^T are formed,
  plus column vectors (lse, delta, positions, ids: 8 each) and addresses, within the 240 of
  ``BlockSizes.registers``.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ringattention.kernels.hopper import bwd_common as hbc
from ringattention.kernels.hopper import bwd_kernels as hbk
from ringattention.kernels.hopper import fused_bwd as hfb
from ringattention.kernels.hopper import mosaic as hm

F32 = jnp.float32
WGS = hm.COMPUTE_WGS
ROWS = 64  # keys per CTA (shared by the warpgroups) and queries per streamed block
HALF = ROWS // WGS  # streamed queries per warpgroup in s^T, dp^T
D = 256  # padded head dim of this kernel (the largest: ``split_bwd.padded_dims``)


def _halves(wg, d: int, dv: int):
    """Warpgroup wg's columns of dk, dq (head dim d) and of dv (dv): one slice where d == dv."""
    dw = pl.ds(wg * (d // WGS), d // WGS)
    return dw, dw if dv == d else pl.ds(wg * (dv // WGS), dv // WGS)


def _probs(cfg: hbc.BwdConfig, ops: hm.Ops, w, slot, own, smem, masked: bool):
    """Warpgroup w's half of one pair: p^T, ds^T float32 [64 keys, 32 queries] (0 where hidden;
    with a soft cap p^T 16-bit, as ``hbk.kv_probs``). own: ``hbk.load_keys``' triple."""
    k_s, v_s, q_s, do_s, lse_s, dl_s, qp_s, qs_s = smem
    cols = pl.ds(w * HALF, HALF)
    half = lambda ref: None if ref is None else ref.at[slot, cols]  # noqa: E731

    def probs(s_t):  # raw logits [64, 32] -> probabilities (and with a soft cap p^T (1 - t^2))
        lse = lax.broadcast_in_dim(ops.cols(half(lse_s)), s_t.shape, [1])
        x, t = hbc.log2_logits(cfg, s_t)
        p_t = jnp.exp2(x - lse)
        if masked:
            vis = hbc.visibility(cfg, ops, s_t.shape, own, half(qp_s), half(qs_s), False)
            p_t = jnp.where(vis, p_t, 0.0)
        return p_t if t is None else (p_t.astype(k_s.dtype), hbc.capped(p_t, t))

    p_t, dp_t = ops.pair(
        (hm.Smem(k_s), hm.Smem(q_s.at[slot, cols], transposed=True)),
        (hm.Smem(v_s), hm.Smem(do_s.at[slot, cols], transposed=True)),
        (ROWS, HALF),
        probs,
    )
    p_t, g_t = (p_t, p_t) if cfg.softcap is None else p_t
    ds_t = g_t * (dp_t - lax.broadcast_in_dim(ops.cols(half(dl_s)), dp_t.shape, [1]))
    return p_t, ds_t


def split_kernel(*refs, cfg: hbc.BwdConfig):
    """Grid ("h", "i", "b") over kv heads and key CTAs of 64 keys, warpgroups "wg". GMEM inputs as
    ``hbk.dkv_kernel``. Out: dk f32 [B, K, Sk, D], dv f32 [B, K, Sk, Dv]
    (``split_bwd.padded_dims``)."""
    bounds, gmem, (qp_ref, kp_ref), (qs_ref, ks_ref), (dk_ref, dv_ref), scratch = hbc.split_refs(refs, cfg, 2)
    q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref = gmem
    k_s, v_s, kp_s, ks_s, q_s, do_s, lse_s, dl_s, qp_s, qs_s = scratch[:10]  # own keys; slots
    pt_s, dst_s, own_bar, loaded, free, pds_ready, pds_free = scratch[10:]  # shared tiles; barriers
    b, i, bounds = hbc.cta_index(cfg, bounds, reverse=False)  # causal: early keys are heaviest
    lo, hi = bounds[0], bounds[2]
    kvh, wg = lax.axis_index("h"), lax.axis_index("wg")
    n = hi - lo  # query blocks per head of the group
    slots = (q_s, do_s, lse_s, dl_s, qp_s, qs_s)
    issue = hbk.query_issuer(cfg, b, kvh, bounds, i, (q_ref, do_ref, lse_ref, dl_ref, qp_ref, qs_ref), slots)

    @pl.when(wg == WGS)
    def _():
        hbc.stream(cfg, n * cfg.groups, issue, loaded, free)

    @pl.when(wg < WGS)
    def _():
        hm.set_registers(cfg.registers, compute=True, interpret=cfg.interpret)
        ops = hfb.FusedOps(cfg.interpret)
        keys = pl.ds(i * ROWS, ROWS)
        own = _load_own_keys(
            cfg, ops, b, kvh, wg, keys, (k_ref, v_ref, kp_ref, ks_ref), (k_s, v_s, kp_s, ks_s), own_bar
        )
        own = (*own, hbc.causal_rows(cfg, *own, hbc.row_prefix(refs, cfg, b), queries=False))
        smem = (k_s, v_s, q_s, do_s, lse_s, dl_s, qp_s, qs_s)
        d, d_v = k_s.shape[1], v_s.shape[1]
        dw, dwv = _halves(wg, d, d_v)

        def body(j, carry, g, masked: bool):
            t = g * n + j - lo
            slot = lax.rem(t, jnp.int32(cfg.stages))
            plgpu.barrier_wait(loaded.at[slot])
            p_t, ds_t = _probs(cfg, ops, wg, slot, own, smem, masked)  # [64, 32]
            pl.when(t > 0)(lambda: plgpu.barrier_wait(pds_free))  # the last pair's reads are done
            half = pl.ds(wg * HALF, HALF)
            pt_s.at[:, half][...] = p_t.astype(pt_s.dtype)
            ops.stage(dst_s.at[:, half], ds_t.astype(dst_s.dtype))  # + fence for wgmma
            plgpu.barrier_arrive(pds_ready)
            plgpu.barrier_wait(pds_ready)  # both halves of p^T, ds^T written
            dk, dv = carry
            dv, dk = ops.mma(
                (dv, hm.Smem(pt_s), hm.Smem(do_s.at[slot, :, dwv])),
                (dk, hm.Smem(dst_s), hm.Smem(q_s.at[slot, :, dw])),
            )
            plgpu.barrier_arrive(free.at[slot])
            plgpu.barrier_arrive(pds_free)
            return dk, dv

        outs = (dk_ref.at[b, kvh, keys, dw], dv_ref.at[b, kvh, keys, dwv])
        hbk.group_loop(cfg, ops, body, bounds, cfg.masked, d // WGS, outs, d_v // WGS)
        pl.when(n > 0)(lambda: plgpu.barrier_wait(pds_free))  # observe the last phase


def dq_kernel(*refs, cfg: hbc.BwdConfig):
    """dq (deterministic): grid ("h", "i", "b") over query heads and CTAs of 64 query
    rows shared by both warpgroups; key blocks of 64 streamed. Warpgroup w computes s, dp for the
    keys [32w, 32w + 32) ([64 queries, 32 keys]), writes its half of ds (16-bit) to a shared
    [64, 64] tile, and after a barrier accumulates dq[:, Dw] += ds k[:, Dw] in registers (64 per
    thread at 256); written once at the end. Inputs as ``hbk.dq_kernel``; out: dq f32
    [B, H, Sq, D]."""
    bounds, gmem, (qp_ref, kp_ref), (qs_ref, ks_ref), (dq_ref,), scratch = hbc.split_refs(refs, cfg, 1)
    q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref = gmem
    q_s, do_s, lse_s, dl_s, qp_s, qs_s, k_s, v_s, kp_s, ks_s = scratch[:10]  # own queries; slots
    own_bar, loaded, free, ds_s, ds_ready, ds_free = scratch[10:]  # barriers, the shared ds tile
    b, i, bounds = hbc.cta_index(cfg, bounds, reverse=cfg.causal)  # causal: latest rows first
    lo, hi = bounds[0], bounds[2]
    h, wg = lax.axis_index("h"), lax.axis_index("wg")
    kvh = lax.div(h, jnp.int32(cfg.groups))

    @pl.when(wg == WGS)
    def _():
        issue = hbk.key_issuer(cfg, b, kvh, lo, (k_ref, v_ref, kp_ref, ks_ref), (k_s, v_s, kp_s, ks_s))
        hbc.stream(cfg, hi - lo, issue, loaded, free)

    @pl.when(wg < WGS)
    def _():
        hm.set_registers(cfg.registers, compute=True, interpret=cfg.interpret)
        ops = hm.Ops(cfg.interpret)
        rows = pl.ds(i * ROWS, ROWS)
        own_rows = (
            q_ref.at[b, rows, h],
            do_ref.at[b, rows, h],
            lse_ref.at[b, h, rows],
            dl_ref.at[b, h, rows],
            qp_ref.at[rows] if cfg.positions else None,
            qs_ref.at[b, rows] if cfg.segments else None,
        )
        own_smem = (q_s, do_s, lse_s, dl_s, qp_s, qs_s)
        lse, delta, *own = _load_own_queries(cfg, ops, wg, own_rows, own_smem, own_bar)
        own = (*own, hbc.causal_rows(cfg, *own, hbc.row_prefix(refs, cfg, b), queries=True))
        d = q_s.shape[1]
        half, dw = pl.ds(wg * HALF, HALF), pl.ds(wg * (d // WGS), d // WGS)

        def body(j, dq, masked: bool):
            t = j - lo
            slot = lax.rem(t, jnp.int32(cfg.stages))
            plgpu.barrier_wait(loaded.at[slot])

            at = lambda ref: None if ref is None else ref.at[slot, half]  # noqa: E731
            keys = (at(kp_s), at(ks_s))
            probs = functools.partial(hbc.query_probs, cfg, ops, lse=lse, own=own, keys=keys, masked=masked)
            p, dp = ops.pair(
                (hm.Smem(q_s), hm.Smem(k_s.at[slot, half], transposed=True)),
                (hm.Smem(do_s), hm.Smem(v_s.at[slot, half], transposed=True)),
                (ROWS, HALF),
                probs,
            )
            ds = p * (dp - lax.broadcast_in_dim(delta, dp.shape, [0]))  # [64, 32]
            pl.when(t > 0)(lambda: plgpu.barrier_wait(ds_free))  # both read the last ds
            hfb.FusedOps(cfg.interpret).stage(ds_s.at[:, half], ds.astype(ds_s.dtype))
            plgpu.barrier_arrive(ds_ready)
            plgpu.barrier_wait(ds_ready)  # both halves of ds written
            (dq,) = ops.mma((dq, hm.Smem(ds_s), hm.Smem(k_s.at[slot, :, dw])))
            plgpu.barrier_arrive(free.at[slot])
            plgpu.barrier_arrive(ds_free)
            return dq

        dq = hbc.block_loops(body, bounds, cfg.masked, ops.full((ROWS, d // WGS), 0.0))  # from lo
        pl.when(hi > lo)(lambda: plgpu.barrier_wait(ds_free))  # observe the last phase
        dq_ref.at[b, h, rows, dw][...] = dq * cfg.scale


def _load_own_queries(cfg, ops, wg, gmem, smem, bar):
    """Warpgroup 0 loads the CTA's query rows (q, do, lse2, delta, positions, ids; None when
    unused), both wait; returns lse2, delta, positions, ids as row vectors."""

    @pl.when(wg == 0)
    def _():
        for src, dst in zip(gmem, smem, strict=True):
            if dst is not None:
                plgpu.copy_gmem_to_smem(src, dst, bar)

    plgpu.barrier_wait(bar)
    _, _, lse_s, dl_s, qp_s, qs_s = smem
    return (
        ops.rows(lse_s),
        ops.rows(dl_s),
        ops.rows(qp_s) if cfg.positions else None,
        ops.rows(qs_s) if cfg.segments else None,
    )


def _load_own_keys(cfg, ops, b, kvh, wg, keys, gmem, smem, bar):
    """Warpgroup 0 loads the CTA's keys (k, v, positions, ids), both wait; returns the positions /
    ids as row vectors (None when unused)."""
    (k_ref, v_ref, kp_ref, ks_ref), (k_s, v_s, kp_s, ks_s) = gmem, smem

    @pl.when(wg == 0)
    def _():
        for src, dst in (
            (k_ref.at[b, keys, kvh], k_s),
            (v_ref.at[b, keys, kvh], v_s),
            (kp_ref.at[keys] if cfg.positions else None, kp_s),
            (ks_ref.at[b, keys] if cfg.segments else None, ks_s),
        ):
            if dst is not None:
                plgpu.copy_gmem_to_smem(src, dst, bar)

    plgpu.barrier_wait(bar)
    return (ops.rows(kp_s) if cfg.positions else None), (ops.rows(ks_s) if cfg.segments else None)


def dkv_scratch(dtype, stages: int, positions: bool, segments: bool, d: int = D, dv: int = D):
    """Own k [64, d], v [64, dv] (+ positions, ids); per stage q, do, lse2, delta (+ positions,
    ids); p^T, ds^T; barriers: own keys loaded, slot loaded, slot free, p^T/ds^T written, p^T/ds^T
    read. The dk/dv kernels' buffers; ``dq_scratch`` has the dq kernel's."""
    # 64-byte swizzle everywhere: wgmma needs both operands alike, and each warpgroup writes a
    # 32-column half of p^T / ds^T, which must be whole tiles of the layout.
    tiles = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(64))
    ivec = lambda shape, on: plgpu.SMEM(shape, jnp.int32) if on else None  # noqa: E731
    extra = positions + segments
    return [
        plgpu.SMEM((ROWS, d), dtype, transforms=tiles),
        plgpu.SMEM((ROWS, dv), dtype, transforms=tiles),
        ivec((ROWS,), positions),
        ivec((ROWS,), segments),
        plgpu.SMEM((stages, ROWS, d), dtype, transforms=tiles),
        plgpu.SMEM((stages, ROWS, dv), dtype, transforms=tiles),
        plgpu.SMEM((stages, ROWS), F32),
        plgpu.SMEM((stages, ROWS), F32),
        ivec((stages, ROWS), positions),
        ivec((stages, ROWS), segments),
        plgpu.SMEM((ROWS, ROWS), dtype, transforms=tiles),  # p^T [64 keys, 64 queries]
        plgpu.SMEM((ROWS, ROWS), dtype, transforms=tiles),  # ds^T
        plgpu.Barrier(num_arrivals=2 + extra),
        plgpu.Barrier(num_arrivals=4 + extra, num_barriers=stages),
        plgpu.Barrier(num_arrivals=WGS, num_barriers=stages),
        plgpu.Barrier(num_arrivals=WGS),
        plgpu.Barrier(num_arrivals=WGS),
    ]


def dq_scratch(dtype, stages: int, positions: bool, segments: bool, d: int = D, dv: int = D):
    """Own q [64, d], do [64, dv], lse2, delta (+ positions, ids); per stage k, v (+ positions,
    ids); ds; barriers: own rows loaded, slot loaded, slot free, ds written, ds read."""
    tiles = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(64))  # as in ``dkv_scratch``
    ivec = lambda shape, on: plgpu.SMEM(shape, jnp.int32) if on else None  # noqa: E731
    extra = positions + segments
    return [
        plgpu.SMEM((ROWS, d), dtype, transforms=tiles),
        plgpu.SMEM((ROWS, dv), dtype, transforms=tiles),
        plgpu.SMEM((ROWS,), F32),
        plgpu.SMEM((ROWS,), F32),
        ivec((ROWS,), positions),
        ivec((ROWS,), segments),
        plgpu.SMEM((stages, ROWS, d), dtype, transforms=tiles),
        plgpu.SMEM((stages, ROWS, dv), dtype, transforms=tiles),
        ivec((stages, ROWS), positions),
        ivec((stages, ROWS), segments),
        plgpu.Barrier(num_arrivals=4 + extra),
        plgpu.Barrier(num_arrivals=2 + extra, num_barriers=stages),
        plgpu.Barrier(num_arrivals=WGS, num_barriers=stages),
        plgpu.SMEM((ROWS, ROWS), dtype, transforms=tiles),  # ds [64 queries, 64 keys]
        plgpu.Barrier(num_arrivals=WGS),
        plgpu.Barrier(num_arrivals=WGS),
    ]


def smem_bytes(
    dtype, stages: int, positions: bool = True, segments: bool = True, d: int = D, dv: int = D
) -> int:
    """Shared memory of the buffers above (barriers and alignment excluded); d, dv: the padded
    head dims of q/k and v."""
    tile = ROWS * (d + dv) * jnp.dtype(dtype).itemsize  # a [64, d] and a [64, dv] tile
    vecs = 4 * ROWS * (2 + positions + segments)  # per stage: lse2, delta (+ positions, ids)
    return (
        tile
        + 4 * ROWS * (positions + segments)
        + stages * (tile + vecs)
        + 2 * ROWS * ROWS * jnp.dtype(dtype).itemsize
    )
