"""Fused Pallas Mosaic GPU (Hopper) ring-step backward for head dim 256: the head dim split in two.

The FlashAttention-3 backward (Shah et al. 2024; its head-dim-256 configuration) for one step of
Ring Attention (Liu, Zaharia & Abbeel 2023), for head dims that pad to more than 128
(``hopper_fused_bwd.py`` does not fit there: each warpgroup would hold dk and dv of its 64 keys,
[64, 256] float32 each, 256 registers per thread): ``pallas_hopper.BlockSizes(backward="mosaic")``,
the default, runs the deterministic pair below; ``backward="fused"`` the one kernel whose atomics
make it 2.2x slower on an H200 (docs/kernels.md).

Here the two compute warpgroups of a CTA *share* its 64 keys (grid: kv head, key CTA, batch) and
split the work of every (key block, query block) pair without doing any of it twice:

* s^T = k q^T and dp^T = v do^T: warpgroup w takes the 32 queries [32w, 32w + 32) of the streamed
  64-query block (wgmma [64 keys, 32 queries], contracting the whole head dim), and writes its half
  of p^T and ds^T (16-bit) to one shared [64 keys, 64 queries] tile each;
* after a barrier, dv[:, Dw] += p^T do[:, Dw] and dk[:, Dw] += ds^T q[:, Dw] over its 128 head-dim
  columns Dw = [128w, 128w + 128), and dq[:, Dw] = ds k[:, Dw], which it adds to a float32 [B, H,
  Sq, 256] buffer with per-element atomic adds from registers (FA3 at head dim 256 does the same:
  there is no shared memory left to stage a TMA reduce-add).

Per pair that is the fused count of 5 tile products (2.5 per warpgroup). The query blocks are visited
in the order of the other key-CTA kernels (``hopper_bwd_kernels.visit``: reversed, rotated by the
CTA index) and the GQA group loop is theirs (``group_loop``). The atomic adds arrive in a
run-dependent order: dq is not bitwise reproducible.

``BlockSizes(backward="mosaic")`` at these head dims selects the deterministic variant: the same
kernel without dq (``with_dq=False``), and ``dq_kernel``, whose CTAs own 64 query rows shared by the
two warpgroups the same way (s and dp split by keys, ds through shared memory, dq[:, Dw] kept in
registers and written once): 7 tile products per pair instead of 5, no atomics, every output
element written by one warpgroup after a loop in a fixed order.

Masks as in ``hopper_bwd_kernels``: blocks outside the causal mask, the segments or a sliding window
are never loaded; with a window (``window=W``) both kernels take the ``edge`` bound as their last
input and run the blocks at the window's far edge masked before the fully visible ones, and
positions are loaded whenever a window is set. Without a window the kernels are unchanged.

Budgets (bf16/fp16, D = 256, per CTA of 2 compute warpgroups + 1 producer):

* shared memory (``smem_bytes``, the larger of the dk/dv and dq kernels'): own k, v 2 x 32 KB;
  per stage q, do 2 x 32 KB (+ 1 KB of lse,
  delta, positions, ids); p^T, ds^T 2 x 8 KB; with 2 stages 210.5 KB of the 227 KB (214 KB as Mosaic
  GPU allocates it, with barriers and alignment; 3 stages: 274 KB, rejected by the wrapper);
* registers per compute thread (128 threads, float32 [64, n] = n / 2 registers): dk, dv [64, 128]
  64 + 64; s^T, dp^T [64, 32] 16 + 16 while p^T / ds^T are formed; dq [64, 128] 64 while dk, dv
  and dq are in flight together: 192 at the peak, plus column vectors (lse, delta, positions, ids:
  8 each) and addresses, within the 240 of ``BlockSizes.registers``.

Interpret mode (CPU): the interpreter has no atomics, so the add is a read-modify-write; exact there,
because it runs grid points one after another and the two warpgroups own disjoint columns.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ringattention import masks
from ringattention._vma import full_like
from ringattention.kernels import hopper_backward as hb
from ringattention.kernels import hopper_bwd_kernels as hbk
from ringattention.kernels import hopper_fused_bwd as hfb
from ringattention.kernels import hopper_kernels as hk
from ringattention.kernels import pallas_gpu as pg

F32 = jnp.float32
WGS = hk.COMPUTE_WGS
ROWS = 64  # keys per CTA (shared by the warpgroups) and queries per streamed block
HALF = ROWS // WGS  # streamed queries per warpgroup in s^T, dp^T
D = 256  # padded head dim of this kernel
DW = D // WGS  # head-dim columns of dk, dv, dq per warpgroup


def _probs(cfg: hbk.BwdConfig, ops: hk.Ops, w, slot, own, smem, masked: bool):
    """Warpgroup w's half of one pair: p^T, ds^T float32 [64 keys, 32 queries] (0 where hidden)."""
    k_s, v_s, q_s, do_s, lse_s, dl_s, qp_s, qs_s = smem
    cols = pl.ds(w * HALF, HALF)
    half = lambda ref: None if ref is None else ref.at[slot, cols]  # noqa: E731

    def probs(s_t):  # raw logits [64, 32] -> probabilities
        lse = lax.broadcast_in_dim(ops.cols(half(lse_s)), s_t.shape, [1])
        p_t = jnp.exp2(s_t * cfg.qk_scale - lse)
        if not masked:
            return p_t
        return jnp.where(hbk._vis(cfg, ops, s_t.shape, *own, half(qp_s), half(qs_s), False), p_t,
                         0.0)

    p_t, dp_t = ops.pair((hk.Smem(k_s), hk.Smem(q_s.at[slot, cols], transposed=True)),
                         (hk.Smem(v_s), hk.Smem(do_s.at[slot, cols], transposed=True)),
                         (ROWS, HALF), probs)
    ds_t = p_t * (dp_t - lax.broadcast_in_dim(ops.cols(half(dl_s)), dp_t.shape, [1]))
    return p_t, ds_t


def split_kernel(*refs, cfg: hbk.BwdConfig, with_dq: bool = True):
    """Grid ("h", "i", "b") over kv heads and key CTAs of 64 keys, warpgroups "wg". GMEM inputs as
    ``hbk.dkv_kernel``, then (``with_dq``) the dq accumulator f32 [B, H, Sq, 256] (a Ref, added
    to). Out: dk, dv f32 [B, K, Sk, 256]."""
    bounds, (q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref), (qp_ref, kp_ref), (qs_ref, ks_ref), \
        outs, scratch = hbk._split(refs, cfg, 2 + with_dq)
    dq_ref, dk_ref, dv_ref = outs if with_dq else (None, *outs)
    (k_s, v_s, kp_s, ks_s, q_s, do_s, lse_s, dl_s, qp_s, qs_s, pt_s, dst_s, own_bar, loaded, free,
     pds_ready, pds_free) = scratch
    b, i, bounds = hbk._cta(cfg, bounds, reverse=False)  # causal: early keys are heaviest
    lo, hi = bounds[0], bounds[2]
    kvh, wg = lax.axis_index("h"), lax.axis_index("wg")
    n = hi - lo  # query blocks per head of the group
    issue = hbk.query_issuer(cfg, b, kvh, bounds, i,
                             (q_ref, do_ref, lse_ref, dl_ref, qp_ref, qs_ref),
                             (q_s, do_s, lse_s, dl_s, qp_s, qs_s))

    @pl.when(wg == WGS)
    def _():
        hbk._stream(cfg, n * cfg.groups, issue, loaded, free)

    @pl.when(wg < WGS)
    def _():
        hk.set_registers(cfg.registers, compute=True, interpret=cfg.interpret)
        ops = hfb.FusedOps(cfg.interpret)
        keys = pl.ds(i * ROWS, ROWS)
        own = _load_own_keys(cfg, ops, b, kvh, wg, keys, (k_ref, v_ref, kp_ref, ks_ref),
                             (k_s, v_s, kp_s, ks_s), own_bar)
        smem = (k_s, v_s, q_s, do_s, lse_s, dl_s, qp_s, qs_s)
        dw = pl.ds(wg * DW, DW)

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
            terms = [(dv, hk.Smem(pt_s), hk.Smem(do_s.at[slot, :, dw])),
                     (dk, hk.Smem(dst_s), hk.Smem(q_s.at[slot, :, dw]))]
            if with_dq:  # dq [64 queries, Dw] = ds k[:, Dw], issued with dk and dv
                terms.append(((ROWS, DW), hk.Smem(dst_s, transposed=True), hk.Smem(k_s.at[:, dw])))
            dv, dk, *dq = ops.mma(*terms)
            plgpu.barrier_arrive(free.at[slot])
            plgpu.barrier_arrive(pds_free)
            if with_dq:
                blk = hbk.visit(j, bounds, i, q_ref.shape[1] // ROWS)
                _add(cfg, dq[0], dq_ref.at[b, kvh * cfg.groups + g, pl.ds(blk * ROWS, ROWS), dw])
            return dk, dv

        hbk.group_loop(cfg, ops, body, bounds, cfg.masked, DW,
                       (dk_ref.at[b, kvh, keys, dw], dv_ref.at[b, kvh, keys, dw]))
        pl.when(n > 0)(lambda: plgpu.barrier_wait(pds_free))  # observe the last phase


def dq_kernel(*refs, cfg: hbk.BwdConfig):
    """The deterministic variant's dq: grid ("h", "i", "b") over query heads and CTAs of 64 query
    rows shared by both warpgroups; key blocks of 64 streamed. Warpgroup w computes s, dp for the
    keys [32w, 32w + 32) ([64 queries, 32 keys]), writes its half of ds (16-bit) to a shared
    [64, 64] tile, and after a barrier accumulates dq[:, Dw] += ds k[:, Dw] in registers (64 per
    thread); written once at the end. Inputs as ``hbk.dq_kernel``; out: dq f32 [B, H, Sq, 256]."""
    bounds, (q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref), (qp_ref, kp_ref), (qs_ref, ks_ref), \
        (dq_ref,), scratch = hbk._split(refs, cfg, 1)
    (q_s, do_s, lse_s, dl_s, qp_s, qs_s, k_s, v_s, kp_s, ks_s, own_bar, loaded, free, ds_s,
     ds_ready, ds_free) = scratch
    b, i, bounds = hbk._cta(cfg, bounds, reverse=cfg.causal)  # causal: latest rows first
    lo, hi = bounds[0], bounds[2]
    h, wg = lax.axis_index("h"), lax.axis_index("wg")
    kvh = lax.div(h, jnp.int32(cfg.groups))

    @pl.when(wg == WGS)
    def _():
        issue = _key_issuer(cfg, b, kvh, lo, (k_ref, v_ref, kp_ref, ks_ref), (k_s, v_s, kp_s, ks_s))
        hbk._stream(cfg, hi - lo, issue, loaded, free)

    @pl.when(wg < WGS)
    def _():
        hk.set_registers(cfg.registers, compute=True, interpret=cfg.interpret)
        ops = hk.Ops(cfg.interpret)
        rows = pl.ds(i * ROWS, ROWS)
        lse, delta, own_pos, own_seg = _load_own_queries(
            cfg, ops, wg, (q_ref.at[b, rows, h], do_ref.at[b, rows, h], lse_ref.at[b, h, rows],
                           dl_ref.at[b, h, rows], qp_ref.at[rows] if cfg.positions else None,
                           qs_ref.at[b, rows] if cfg.segments else None),
            (q_s, do_s, lse_s, dl_s, qp_s, qs_s), own_bar)
        half, dw = pl.ds(wg * HALF, HALF), pl.ds(wg * DW, DW)

        def body(j, dq, masked: bool):
            t = j - lo
            slot = lax.rem(t, jnp.int32(cfg.stages))
            plgpu.barrier_wait(loaded.at[slot])

            def probs(s):  # raw logits [64 queries, 32 keys] -> probabilities, 0 where hidden
                p = jnp.exp2(s * cfg.qk_scale - lax.broadcast_in_dim(lse, s.shape, [0]))
                if not masked:
                    return p
                at = lambda ref: None if ref is None else ref.at[slot, half]  # noqa: E731
                vis = hbk._vis(cfg, ops, s.shape, own_pos, own_seg, at(kp_s), at(ks_s), True)
                return jnp.where(vis, p, 0.0)

            p, dp = ops.pair((hk.Smem(q_s), hk.Smem(k_s.at[slot, half], transposed=True)),
                             (hk.Smem(do_s), hk.Smem(v_s.at[slot, half], transposed=True)),
                             (ROWS, HALF), probs)
            ds = p * (dp - lax.broadcast_in_dim(delta, dp.shape, [0]))  # [64, 32]
            pl.when(t > 0)(lambda: plgpu.barrier_wait(ds_free))  # both read the last ds
            hfb.FusedOps(cfg.interpret).stage(ds_s.at[:, half], ds.astype(ds_s.dtype))
            plgpu.barrier_arrive(ds_ready)
            plgpu.barrier_wait(ds_ready)  # both halves of ds written
            (dq,) = ops.mma((dq, hk.Smem(ds_s), hk.Smem(k_s.at[slot, :, dw])))
            plgpu.barrier_arrive(free.at[slot])
            plgpu.barrier_arrive(ds_free)
            return dq

        dq = hbk.block_loops(body, bounds, cfg.masked, ops.full((ROWS, DW), 0.0))  # slots from lo
        pl.when(hi > lo)(lambda: plgpu.barrier_wait(ds_free))  # observe the last phase
        dq_ref.at[b, h, rows, dw][...] = dq * cfg.scale


def _key_issuer(cfg, b, kvh, lo, gmem, smem):
    """Producer callback of ``dq_kernel``: stream t loads key block lo + t (k, v, positions, ids)."""
    (k_ref, v_ref, kp_ref, ks_ref), (k_s, v_s, kp_s, ks_s) = gmem, smem

    def issue(t, slot, bar):
        cols = pl.ds((lo + t) * ROWS, ROWS)
        for src, dst in ((k_ref.at[b, cols, kvh], k_s), (v_ref.at[b, cols, kvh], v_s),
                         (kp_ref.at[cols] if cfg.positions else None, kp_s),
                         (ks_ref.at[b, cols] if cfg.segments else None, ks_s)):
            if dst is not None:
                plgpu.copy_gmem_to_smem(src, dst.at[slot], bar)

    return issue


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
    return (ops.rows(lse_s), ops.rows(dl_s), ops.rows(qp_s) if cfg.positions else None,
            ops.rows(qs_s) if cfg.segments else None)


def _load_own_keys(cfg, ops, b, kvh, wg, keys, gmem, smem, bar):
    """Warpgroup 0 loads the CTA's keys (k, v, positions, ids), both wait; returns the positions /
    ids as row vectors (None when unused)."""
    (k_ref, v_ref, kp_ref, ks_ref), (k_s, v_s, kp_s, ks_s) = gmem, smem

    @pl.when(wg == 0)
    def _():
        for src, dst in ((k_ref.at[b, keys, kvh], k_s), (v_ref.at[b, keys, kvh], v_s),
                         (kp_ref.at[keys] if cfg.positions else None, kp_s),
                         (ks_ref.at[b, keys] if cfg.segments else None, ks_s)):
            if dst is not None:
                plgpu.copy_gmem_to_smem(src, dst, bar)

    plgpu.barrier_wait(bar)
    return (ops.rows(kp_s) if cfg.positions else None), (ops.rows(ks_s) if cfg.segments else None)


def _add(cfg: hbk.BwdConfig, x, gmem):
    """gmem += x (float32 [64, 128]): atomic adds on the device; a read-modify-write when
    interpreting (see the module docstring)."""
    if cfg.interpret:
        gmem[...] = gmem[...] + x
    else:
        plgpu.atomic_add(gmem, x)


def _scratch(dtype, stages: int, positions: bool, segments: bool):
    """Own k, v (+ positions, ids); per stage q, do, lse2, delta (+ positions, ids); p^T, ds^T;
    barriers: own keys loaded, slot loaded, slot free, p^T/ds^T written, p^T/ds^T read. The dk/dv
    kernels' buffers; ``_dq_scratch`` has the dq kernel's."""
    # 64-byte swizzle everywhere: wgmma needs both operands alike, and each warpgroup writes a
    # 32-column half of p^T / ds^T, which must be whole tiles of the layout.
    tiles = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(64))
    ivec = lambda shape, on: plgpu.SMEM(shape, jnp.int32) if on else None  # noqa: E731
    extra = positions + segments
    return [plgpu.SMEM((ROWS, D), dtype, transforms=tiles),
            plgpu.SMEM((ROWS, D), dtype, transforms=tiles),
            ivec((ROWS,), positions), ivec((ROWS,), segments),
            plgpu.SMEM((stages, ROWS, D), dtype, transforms=tiles),
            plgpu.SMEM((stages, ROWS, D), dtype, transforms=tiles),
            plgpu.SMEM((stages, ROWS), F32), plgpu.SMEM((stages, ROWS), F32),
            ivec((stages, ROWS), positions), ivec((stages, ROWS), segments),
            plgpu.SMEM((ROWS, ROWS), dtype, transforms=tiles),  # p^T [64 keys, 64 queries]
            plgpu.SMEM((ROWS, ROWS), dtype, transforms=tiles),  # ds^T
            plgpu.Barrier(num_arrivals=2 + extra),
            plgpu.Barrier(num_arrivals=4 + extra, num_barriers=stages),
            plgpu.Barrier(num_arrivals=WGS, num_barriers=stages),
            plgpu.Barrier(num_arrivals=WGS), plgpu.Barrier(num_arrivals=WGS)]


def _dq_scratch(dtype, stages: int, positions: bool, segments: bool):
    """Own q, do, lse2, delta (+ positions, ids); per stage k, v (+ positions, ids); ds; barriers:
    own rows loaded, slot loaded, slot free, ds written, ds read."""
    tiles = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(64))  # as in ``_scratch``
    ivec = lambda shape, on: plgpu.SMEM(shape, jnp.int32) if on else None  # noqa: E731
    extra = positions + segments
    return [plgpu.SMEM((ROWS, D), dtype, transforms=tiles), plgpu.SMEM((ROWS, D), dtype, transforms=tiles),
            plgpu.SMEM((ROWS,), F32), plgpu.SMEM((ROWS,), F32),
            ivec((ROWS,), positions), ivec((ROWS,), segments),
            plgpu.SMEM((stages, ROWS, D), dtype, transforms=tiles),
            plgpu.SMEM((stages, ROWS, D), dtype, transforms=tiles),
            ivec((stages, ROWS), positions), ivec((stages, ROWS), segments),
            plgpu.Barrier(num_arrivals=4 + extra),
            plgpu.Barrier(num_arrivals=2 + extra, num_barriers=stages),
            plgpu.Barrier(num_arrivals=WGS, num_barriers=stages),
            plgpu.SMEM((ROWS, ROWS), dtype, transforms=tiles),  # ds [64 queries, 64 keys]
            plgpu.Barrier(num_arrivals=WGS), plgpu.Barrier(num_arrivals=WGS)]


def smem_bytes(dtype, stages: int, positions: bool = True, segments: bool = True) -> int:
    """Shared memory of the buffers above (barriers and alignment excluded)."""
    tile = ROWS * D * jnp.dtype(dtype).itemsize
    vecs = 4 * ROWS * (2 + positions + segments)  # per stage: lse2, delta (+ positions, ids)
    return (2 * tile + 4 * ROWS * (positions + segments) + stages * (2 * tile + vecs)
            + 2 * ROWS * ROWS * jnp.dtype(dtype).itemsize)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _run(lo, mid, hi, q, k, v, do, lse2, delta, *extra, cfg: hbk.BwdConfig):
    """Padded inputs -> unscaled dq f32 [B, H, Sq, 256], dk, dv f32 [B, K, Sk, 256]."""
    B, sq, H, d = q.shape
    sk, K = k.shape[1], k.shape[2]
    dq_acc = jax.new_ref(full_like(q, (B, H, sq, d), 0.0), memory_space=plgpu.GMEM)
    out = jax.ShapeDtypeStruct((B, K, sk, d), F32)
    dk, dv = hfb._launch(functools.partial(split_kernel, cfg=cfg), (out, out),
                         _scratch(q.dtype, cfg.stages, cfg.positions, cfg.segments),
                         grid=(K, sk // ROWS, B), interpret=cfg.interpret)(lo, mid, hi, q, k, v, do,
                                                                          lse2, delta, *extra, dq_acc)
    return dq_acc[...], dk, dv


@functools.partial(jax.jit, static_argnames=("cfg",))
def _run_two(q_bounds, k_bounds, q, k, v, do, lse2, delta, *extra, cfg: hbk.BwdConfig):
    """The deterministic variant: dq f32 [B, H, Sq, 256] (scaled) from ``dq_kernel``, then dk, dv
    f32 [B, K, Sk, 256] from ``split_kernel`` without its dq. q_bounds / k_bounds: lo, mid, hi (and
    a window's edge, each kernel's last input) over the key blocks / the reversed query blocks."""
    B, sq, H, d = q.shape
    sk, K = k.shape[1], k.shape[2]
    args = (q, k, v, do, lse2, delta, *extra)
    dq_cfg = dataclasses.replace(cfg, n_cta=sq // ROWS)
    dq = hk.launch(functools.partial(dq_kernel, cfg=dq_cfg), jax.ShapeDtypeStruct((B, H, sq, d), F32),
                   _dq_scratch(q.dtype, cfg.stages, cfg.positions, cfg.segments),
                   grid=(H, sq // ROWS, B), interpret=cfg.interpret)(*q_bounds[:3], *args,
                                                                        *q_bounds[3:])
    out = jax.ShapeDtypeStruct((B, K, sk, d), F32)
    dk, dv = hk.launch(functools.partial(split_kernel, cfg=cfg, with_dq=False), (out, out),
                       _scratch(q.dtype, cfg.stages, cfg.positions, cfg.segments),
                       grid=(K, sk // ROWS, B), interpret=cfg.interpret)(*k_bounds[:3], *args,
                                                                        *k_bounds[3:])
    return dq, dk, dv


def backward(q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, *, bs, causal: bool,
             softmax_scale: float, interpret: bool, deterministic: bool = False,
             window: int | None = None):
    """float32 dq [B, Sq, H, Dh], dk, dv [B, Sk, K, Dh] for head dims 129-256 (padded to 256;
    contract in ``implementations.py``). ``deterministic``: a dq kernel and the dk/dv kernel
    without atomics (``BlockSizes(backward="mosaic")``) instead of the fused kernel."""
    B, Sq, H, Dh = q.shape
    Sk, K = k.shape[1], k.shape[2]
    if not 128 < Dh <= D:
        raise ValueError(f"hopper_split_bwd: head dim {Dh} ({q.shape=}) must be in (128, {D}]")
    positions = causal or window is not None
    smem = smem_bytes(q.dtype, bs.bwd_stages, positions, q_seg is not None)  # >= the dq kernel's
    if smem > hb.SMEM_LIMIT - 4096:
        raise ValueError(f"pallas_hopper backward={bs.backward!r}: head dim {Dh} (padded {D}) with "
                         f"bwd_stages={bs.bwd_stages} needs {smem} bytes of shared memory (limit "
                         f"{hb.SMEM_LIMIT}); use bwd_stages=2 or backward='triton'")
    up = lambda x: -(-x // ROWS) * ROWS  # noqa: E731
    geo = pg._Geometry(Sq, Sk, Dh, ROWS, ROWS, up(Sq), up(Sk), D)
    q, k, v, q_pos, k_pos, q_seg, k_seg, do = pg._pad_inputs(geo, q, k, v, q_pos, k_pos, q_seg,
                                                            k_seg, do)
    lse2 = jnp.where(jnp.isneginf(lse), 0.0, lse) * hk.LOG2E  # [B, H, Sq] log2 units
    lse2, delta = (pg._pad_to(x, 2, geo.sq_pad) for x in (lse2, delta))
    segments = q_seg is not None
    extra = ((q_pos, k_pos) if positions else ()) + ((q_seg, k_seg) if segments else ())
    cfg = hbk.BwdConfig(rows=ROWS, block=ROWS, stages=bs.bwd_stages, registers=bs.registers,
                        causal=causal, segments=segments, groups=H // K, n_cta=geo.sk_pad // ROWS,
                        qk_scale=softmax_scale * hk.LOG2E, scale=softmax_scale, interpret=interpret,
                        window=window)
    table = masks.block_table(q_pos, k_pos, q_seg, k_seg, causal, ROWS, ROWS, window)
    bounds = hbk.key_cta_bounds(table, B, window)  # over the reversed query blocks, per key CTA
    if deterministic:  # the dq kernel's bounds are over the key blocks
        q_bounds = pg._bounds(table, B) if window is None else pg._edge_bounds(table, B)
        dq, dk, dv = _run_two(q_bounds, bounds, q, k, v, do, lse2, delta, *extra, cfg=cfg)
    else:  # a window's edge bound is the last input
        dq, dk, dv = _run(*bounds[:3], q, k, v, do, lse2, delta, *extra, *bounds[3:], cfg=cfg)
        dq = dq * softmax_scale
    cut = lambda x, n: jnp.swapaxes(x, 1, 2)[:, :n, :, :Dh]  # noqa: E731
    return cut(dq, Sq), cut(dk, Sk), cut(dv, Sk)
