"""FlashAttention-3's head-dim-192 backward layout (MLA: q/k 192, v 128) for one ring step.

FlashAttention-3 (Shah et al. 2024) runs the backward of head dim 192 with 96-key CTAs and three
compute warpgroups (its ``hdim192`` instantiation: kBlockM 64, kBlockN 96, dK/dV swapped), for one
step of Ring Attention (Liu, Zaharia & Abbeel 2023); ``BlockSizes(backward="mla")``. Where the
two-warpgroup kernel (``cta_dq_bwd._three_tiles``) keeps dk [64, 192] and dv [64, 128] float32 per
warpgroup (160 registers per thread before a logit, so s^T and dp^T run one after the other, with
spills), here a CTA owns 96 keys and each streamed 64-query block goes through:

* warpgroup w: ``s = q k_w^T`` and ``dp = do v_w^T`` for its 32 keys ([64 queries, 32], 16
  registers each, both in flight), p and ds, written to shared memory as [64, 96] tiles;
* once all three have written (barrier ``ready``), the swapped products over the whole tile:
  ``dk^T[64 w : 64 w + 64] += q[:, 64 w ...]^T ds`` ([64 head-dim rows, 96 keys]: 48 registers),
  ``dv^T[64 w ...] += do[:, 64 w ...]^T p`` for w < 2 (v's 128 rows), and dq's 64 columns
  ``ds k[:, 64 w ...]`` reduce-added by TMA ([64, 64] float32: one staging tile per warpgroup).

Every 16-bit tile is in 64-byte swizzle: dq's operands reduce over the 96 keys, and Mosaic GPU's
wgmma takes a transposed (MN-major) operand only in whole swizzle atoms along the reduction (64
elements at 128 bytes, 32 at 64 bytes) and one swizzle for both operands. dk, dv are written
transposed ([B, K, D, Sk], transposed after the kernel). Keys are padded to a multiple of 96 (the
padded ones masked by segment ids, ``common.pad_inputs``); the lo/mid/hi bounds, the visiting
order, the GQA group loop, the producer and the masks are the key-CTA kernels' (``bwd_kernels``;
the masks with the own keys as columns, ``_vis(own_cols=True)``).

Registers: three compute warpgroups at 160 per thread and a producer at 32 (65536 per CTA).
Shared memory at 2 stages (``smem_bytes``): k, v 36 + 24 KB; per stage q, do 24 + 16 KB; p, ds 2 x
12 KB; dq staging 3 x 16 KB: 212 KB.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ringattention import masks
from ringattention._vma import vary_like
from ringattention.kernels import common
from ringattention.kernels.hopper import backward as hb
from ringattention.kernels.hopper import bwd_kernels as hbk
from ringattention.kernels.hopper import fused_bwd as hfb
from ringattention.kernels.hopper import mosaic as hm
from ringattention.kernels.hopper.mosaic import Smem

F32 = jnp.float32
WGS = 3  # compute warpgroups
KEYS = 96  # own keys per CTA (FA3's kBlockN at head dim 192)
SLICE = KEYS // WGS  # keys of s and dp per warpgroup
ROWS = 64  # streamed query block
COLS = 64  # head-dim rows of dk^T / dv^T and dq columns per warpgroup
HEAD_DIM, V_HEAD_DIM = 192, 128  # padded q/k and v head dims this kernel takes
# Registers per thread (65536 per CTA, 128 each at launch): the producer keeps 32, the two
# warpgroups with dv^T take 176 (dk^T and dv^T are 96), the third 128 (dk^T: 48; ptxas, H200
# deviceless: fewer spills in the first two than 160 each or 168 / 144); ``REGISTERS`` is their
# mean, from which ``hbk._stream`` derives the producer's share.
DV_REGISTERS = 176
DK_REGISTERS = 128
REGISTERS = 160
TILES = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(64))  # 16-bit: see the docstring
F32_TILES = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))


def mla_kernel(*refs, cfg: hbk.BwdConfig):
    """Grid ("h", "i", "b") over kv heads and 96-key CTAs, warpgroups "wg" (3 compute, then the
    producer). GMEM inputs as ``hbk.dkv_kernel``'s, then the dq accumulator (f32 [B, Sq, H, 192],
    a Ref added to). Out: dk^T f32 [B, K, 192, Sk], dv^T f32 [B, K, 128, Sk]."""
    (
        bounds,
        (q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref),
        (qp_ref, kp_ref),
        (qs_ref, ks_ref),
        outs,
        scratch,
    ) = hbk._split(refs, cfg, 3)
    (k_s, v_s, kp_s, ks_s, q_s, do_s, lse_s, dl_s, qp_s, qs_s, own_bar, loaded, free) = scratch[:13]
    b, i, bounds = hbk._cta(cfg, bounds, reverse=False)  # causal: early keys are heaviest
    lo, hi = bounds[0], bounds[2]
    kvh, wg = lax.axis_index("h"), lax.axis_index("wg")
    n = hi - lo  # query blocks per head of the group
    issue = hbk.query_issuer(
        cfg,
        b,
        kvh,
        bounds,
        i,
        (q_ref, do_ref, lse_ref, dl_ref, qp_ref, qs_ref),
        (q_s, do_s, lse_s, dl_s, qp_s, qs_s),
    )

    @pl.when(wg == WGS)
    def _():
        hbk._stream(cfg, n * cfg.groups, issue, loaded, free)

    @pl.when(wg < WGS)
    def _():
        keys = pl.ds(i * KEYS, KEYS)

        @pl.when(wg == 0)
        def _():
            for src, dst in (
                (k_ref.at[b, keys, kvh], k_s),
                (v_ref.at[b, keys, kvh], v_s),
                (kp_ref.at[keys] if cfg.positions else None, kp_s),
                (ks_ref.at[b, keys] if cfg.segments else None, ks_s),
            ):
                if dst is not None:
                    plgpu.copy_gmem_to_smem(src, dst, own_bar)

        plgpu.barrier_wait(own_bar)
        ops = hfb.FusedOps(cfg.interpret)
        mine = pl.ds(wg * SLICE, SLICE)  # the warpgroup's keys of s and dp
        prefix = hbk.row_prefix(refs, cfg, b)

        def own():  # the keys' positions, ids, causal positions [SLICE] (columns: 8 registers
            # each per thread, so read from shared memory in each masked pair, not carried)
            own_pos = ops.cols(kp_s.at[mine]) if cfg.positions else None
            own_seg = ops.cols(ks_s.at[mine]) if cfg.segments else None
            return own_pos, own_seg, hbk.causal_rows(cfg, own_pos, own_seg, prefix, queries=False)

        dk_out, dv_out = outs[1:]
        at = lambda ref: ref.at[b, kvh, pl.ds(wg * COLS, COLS), keys]  # noqa: E731

        def run(has_dv: bool):  # warpgroups 0, 1 (dv^T's 128 rows) and 2: two copies of the loop
            if not cfg.interpret:  # every compute warpgroup sets its count, or ptxas drops them
                plgpu.set_max_registers(DV_REGISTERS if has_dv else DK_REGISTERS, action="increase")
            step = functools.partial(
                _pair, ctx=(cfg, ops, b, i, kvh, wg, n, bounds, own, scratch, outs[0]), has_dv=has_dv
            )
            dv_at = at(dv_out) if has_dv else None
            hbk.group_loop(cfg, ops, step, bounds, cfg.masked, KEYS, (at(dk_out), dv_at))

        pl.when(wg < 2)(lambda: run(True))
        pl.when(wg == 2)(lambda: run(False))
        pl.when(n > 0)(lambda: plgpu.barrier_wait(scratch[-1]))  # observe the last phase of done
        ops.flush()


def _pair(j, carry, g, masked: bool, *, ctx, has_dv: bool):
    """One (96 own keys, streamed 64-query block) pair for warpgroup ``wg``: carry (dk^T, dv^T)
    float32 [64, 96] each (``dv^T`` None without ``has_dv``: warpgroup 2)."""
    cfg, ops, b, i, kvh, wg, n, bounds, own, smem, dq_acc = ctx
    k_s, v_s, _, _, q_s, do_s, lse_s, dl_s, qp_s, qs_s, _, loaded, free = smem[:13]
    p_s, ds_s, dq_s, ready, done = smem[13:]
    t = g * n + j - bounds[0]
    slot = lax.rem(t, jnp.int32(cfg.stages))
    plgpu.barrier_wait(loaded.at[slot])
    mine = pl.ds(wg * SLICE, SLICE)
    shape = (ROWS, SLICE)
    wide = lambda ref: lax.broadcast_in_dim(ops.rows(ref.at[slot]), shape, [0])  # noqa: E731

    def probs(s):  # raw logits [64 queries, SLICE keys] -> p, and what multiplies dp - delta
        x, tanh = hbk.log2_logits(cfg, s)
        p = jnp.exp2(x - wide(lse_s))
        if masked:
            ref = lambda r: None if r is None else r.at[slot]  # noqa: E731
            p = jnp.where(hbk._vis(cfg, ops, shape, own(), ref(qp_s), ref(qs_s), False, True), p, 0.0)
        return p, hbk.capped(p, tanh)

    (p, g_p), dp = ops.pair(
        (Smem(q_s.at[slot]), Smem(k_s.at[mine], transposed=True)),
        (Smem(do_s.at[slot]), Smem(v_s.at[mine], transposed=True)),
        shape,
        probs,
    )
    ds = g_p * (dp - wide(dl_s))  # [64 queries, SLICE keys]
    pl.when(t > 0)(lambda: plgpu.barrier_wait(done))  # every warpgroup has read the last p, ds
    ops.stage(p_s.at[:, mine], p.astype(q_s.dtype))
    ops.stage(ds_s.at[:, mine], ds.astype(q_s.dtype))
    plgpu.barrier_arrive(ready)
    plgpu.barrier_wait(ready)  # p, ds of all 96 keys written
    cols = pl.ds(wg * COLS, COLS)
    dk_t, dv_t = carry
    terms = [
        (dk_t, Smem(q_s.at[slot, :, cols], transposed=True), Smem(ds_s)),  # [64 dims, 96 keys]
        ((ROWS, COLS), Smem(ds_s), Smem(k_s.at[:, cols])),  # dq [64 queries, 64 dims]
    ]
    if has_dv:
        terms.append((dv_t, Smem(do_s.at[slot, :, cols], transposed=True), Smem(p_s)))
    dk_t, dq, *dv = ops.mma(*terms)
    plgpu.barrier_arrive(free.at[slot])
    plgpu.barrier_arrive(done)
    blk = hbk.visit(j, bounds, i, dq_acc.shape[1] // ROWS)
    rows = pl.ds(blk * ROWS, ROWS)
    ops.reduce_add(dq_s.at[wg], dq, dq_acc.at[b, rows, kvh * cfg.groups + g, cols])
    return dk_t, (dv[0] if has_dv else None)


def _scratch(dtype, stages: int, positions: bool, segments: bool):
    """Own k [96, 192], v [96, 128] (+ positions, ids), per stage q, do, lse2, delta (+ positions,
    ids), the barriers own / loaded / free, then p, ds [64, 96], dq staging per warpgroup and the
    barriers ready / done."""
    ints = lambda *shape: plgpu.SMEM(shape, jnp.int32) if positions else None  # noqa: E731
    ids = lambda *shape: plgpu.SMEM(shape, jnp.int32) if segments else None  # noqa: E731
    extra = positions + segments
    return [
        plgpu.SMEM((KEYS, HEAD_DIM), dtype, transforms=TILES),
        plgpu.SMEM((KEYS, V_HEAD_DIM), dtype, transforms=TILES),
        ints(KEYS),
        ids(KEYS),
        plgpu.SMEM((stages, ROWS, HEAD_DIM), dtype, transforms=TILES),
        plgpu.SMEM((stages, ROWS, V_HEAD_DIM), dtype, transforms=TILES),
        plgpu.SMEM((stages, ROWS), F32),
        plgpu.SMEM((stages, ROWS), F32),
        ints(stages, ROWS),
        ids(stages, ROWS),
        plgpu.Barrier(num_arrivals=2 + extra),  # own keys loaded
        plgpu.Barrier(num_arrivals=4 + extra, num_barriers=stages),  # slot loaded
        plgpu.Barrier(num_arrivals=WGS, num_barriers=stages),  # slot free
        plgpu.SMEM((ROWS, KEYS), dtype, transforms=TILES),  # p [64 queries, 96 keys]
        plgpu.SMEM((ROWS, KEYS), dtype, transforms=TILES),  # ds
        plgpu.SMEM((WGS, ROWS, COLS), F32, transforms=F32_TILES),  # dq staging
        plgpu.Barrier(num_arrivals=WGS),  # ready: p, ds of every warpgroup written
        plgpu.Barrier(num_arrivals=WGS),  # done: every warpgroup has read them
    ]


def smem_bytes(dtype, stages: int) -> int:
    """Shared memory of the tiles (ints excluded)."""
    item = jnp.dtype(dtype).itemsize
    own = KEYS * (HEAD_DIM + V_HEAD_DIM) * item
    streamed = stages * ROWS * (HEAD_DIM + V_HEAD_DIM) * item
    return own + streamed + 2 * ROWS * KEYS * item + WGS * ROWS * COLS * 4


@functools.partial(jax.jit, static_argnames=("cfg",))
def _run(lo, mid, hi, q, k, v, do, lse2, delta, *extra, cfg: hbk.BwdConfig):
    """Padded inputs -> dq f32 [B, Sq, H, 192] (scaled), dk f32 [B, Sk, K, 192], dv f32
    [B, Sk, K, 128]."""
    B, sq, H, d = q.shape
    sk, K = k.shape[1], k.shape[2]
    # invariant over the manual axes, as in cta_dq_bwd._run (Mosaic GPU refuses varying Refs)
    dq_acc = jax.new_ref(jnp.zeros((B, sq, H, d), F32), memory_space=plgpu.GMEM)
    out = jax.ShapeDtypeStruct((B, K, HEAD_DIM, sk), F32)  # dk^T
    out_v = jax.ShapeDtypeStruct((B, K, V_HEAD_DIM, sk), F32)  # dv^T
    dk_t, dv_t = hfb._launch(
        functools.partial(mla_kernel, cfg=cfg),
        (out, out_v),
        _scratch(q.dtype, cfg.stages, cfg.positions, cfg.segments),
        grid=(K, sk // KEYS, B),
        interpret=cfg.interpret,
        wgs=WGS,
    )(lo, mid, hi, q, k, v, do, lse2, delta, *extra, dq_acc)
    dk = jnp.transpose(dk_t, (0, 3, 1, 2))  # [B, Sk, K, 192]
    dv = jnp.transpose(dv_t, (0, 3, 1, 2))
    return vary_like(dq_acc[...], q) * cfg.scale, dk, dv


def backward(
    q,
    k,
    v,
    do,
    lse,
    delta,
    q_pos,
    k_pos,
    q_seg,
    k_seg,
    *,
    bs,
    causal: bool,
    softmax_scale: float,
    interpret: bool,
    window: int | None = None,
    softcap: float | None = None,
    prefix=None,
    bidirectional: bool = False,
):
    """float32 dq [B, Sq, H, D], dk [B, Sk, K, D], dv [B, Sk, K, Dv] for q/k head dims 129-192 and
    v's up to 128 (contract in ``implementations.py``; optional features as ``hb.backward``'s)."""
    B, Sq, H, D = q.shape
    Sk, K, Dv = k.shape[1], k.shape[2], v.shape[3]
    if not (128 < D <= HEAD_DIM and Dv <= V_HEAD_DIM):
        raise ValueError(
            f"pallas_hopper backward='mla': q/k head dim {D} must be in (128, {HEAD_DIM}] and v's "
            f"{Dv} at most {V_HEAD_DIM}"
        )
    if bs.bwd_stages != 2:
        raise ValueError(
            f"pallas_hopper backward='mla': bwd_stages={bs.bwd_stages}; it runs 2 (3 need "
            f"{smem_bytes(q.dtype, 3)} bytes of shared memory, limit {hb.SMEM_LIMIT - 4096})"
        )
    if interpret and len(jax.devices("cpu")) < WGS + 1:
        raise ValueError(
            f"pallas_hopper backward='mla' with interpret=True: {len(jax.devices('cpu'))} CPU "
            f"device(s); Mosaic GPU's interpreter runs the {WGS + 1} warpgroups as threads that "
            "block inside XLA's CPU runtime, which needs as many CPU devices to not deadlock "
            "(measured: it hangs with 1 or 2); set XLA_FLAGS=--xla_force_host_platform_device_count=8"
            " before jax is imported"
        )
    up = lambda x, m: -(-x // m) * m  # noqa: E731
    geo = common.Geometry(Sq, Sk, D, ROWS, KEYS, up(Sq, ROWS), up(Sk, KEYS), HEAD_DIM, V_HEAD_DIM)
    q, k, v, q_pos, k_pos, q_seg, k_seg, do = common.pad_inputs(geo, q, k, v, q_pos, k_pos, q_seg, k_seg, do)
    lse2 = jnp.where(jnp.isneginf(lse), 0.0, lse) * hm.LOG2E  # [B, H, Sq] log2 units
    lse2, delta = (common.pad_to(x, 2, geo.sq_pad) for x in (lse2, delta))
    segments = q_seg is not None
    positions = causal or window is not None
    extra = ((q_pos, k_pos) if positions else ()) + ((q_seg, k_seg) if segments else ())
    cfg = hbk.BwdConfig(
        rows=ROWS,
        block=ROWS,
        stages=bs.bwd_stages,
        registers=REGISTERS,
        causal=causal,
        segments=segments,
        groups=H // K,
        n_cta=geo.sk_pad // KEYS,
        qk_scale=softmax_scale * hm.LOG2E,
        scale=softmax_scale,
        interpret=interpret,
        window=window,
        compute_wgs=WGS,
        **hb.features(softcap, prefix, bidirectional),
    )
    table = masks.block_table(
        q_pos, k_pos, q_seg, k_seg, causal, ROWS, KEYS, window, prefix=prefix, bidirectional=bidirectional
    )
    bounds = hbk.key_cta_bounds(table, B, window)  # over the reversed query blocks, per key CTA
    extra += tuple(bounds[3:])  # a window's edge bound, then the prefix, are the last inputs
    extra += () if prefix is None else (hb.keep_above_min(prefix),)
    dq, dk, dv = _run(*bounds[:3], q, k, v, do, lse2, delta, *extra, cfg=cfg)
    return dq[:, :Sq, :, :D], dk[:, :Sk, :, :D], dv[:, :Sk, :, :Dv]
