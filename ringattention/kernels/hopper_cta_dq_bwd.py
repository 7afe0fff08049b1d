"""Fused Pallas Mosaic GPU (Hopper) ring-step backward with one dq tile per CTA (head dims 65-128).

A variant of ``hopper_fused_bwd.py`` (FlashAttention-3 backward, Shah et al. 2024, for one step of
Ring Attention, Liu, Zaharia & Abbeel 2023), selected by ``pallas_hopper.BlockSizes(backward="fused",
dq_tile="cta")``. There each compute warpgroup reduce-adds its own dq contribution ``ds_w @ k_w``
([64 queries, D] float32) for every query block it visits: two tiles per CTA and pair. Here the two
warpgroups of a CTA (which visit the same query blocks in the same order) share one: after both
have written ds^T of their 64 keys to shared memory, warpgroup w computes the columns
Dw = [w D/2, (w + 1) D/2) of ``dq = ds_0 @ k_0 + ds_1 @ k_1`` (two wgmmas into one [64, D/2]
accumulator) and reduce-adds that half tile. The reduce-add traffic and the staging buffers halve, the
float32 dq accumulator is one [B, H, Sq, D] buffer (not two), and the dq accumulator in registers is
[64, D/2] (32 registers per thread at D = 128 instead of 64); the price is a barrier between the two
warpgroups per pair (ds^T of both written) and one before ds^T is overwritten (both have read it).

Everything else (dk/dv of the own keys, the visiting order, the GQA group loop, the producer, the
masks and a sliding window's ``edge`` bound) is the fused kernel's, through the same
``hopper_bwd_kernels`` helpers. dq sums in a run-dependent order
(TMA reduce-adds), as in the fused kernel. Interpret mode: the reduce-add is a read-modify-write
(``hopper_fused_bwd.FusedOps``), exact because grid points run one after another and the two
warpgroups own disjoint columns.

Shared memory at D = 128, bf16 (``smem_bytes``): own k, v 2 x 2 x 16 KB; per stage q, do 2 x 16 KB;
ds^T 2 x 8 KB; dq staging 2 x 16 KB: 176 KB with 2 stages, 208 KB with 3 (182 / 214 KB as Mosaic
GPU allocates them; the fused kernel's two [64, 128] float32 staging tiles leave no room for a third
stage).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ringattention.kernels import hopper_backward as hb
from ringattention.kernels import hopper_bwd_kernels as hbk
from ringattention.kernels import hopper_fused_bwd as hfb
from ringattention.kernels import hopper_kernels as hk

F32 = jnp.float32
WGS = hk.COMPUTE_WGS
ROWS = hb.ROWS  # own key rows per compute warpgroup and streamed query block length
CTA = hb.CTA


def _dq_half(ops: hk.Ops, ds_s, k_s, dw, shape):
    """float32 ``shape`` = sum over the warpgroups w' of ds_w' [queries, keys] @ k_w'[:, dw]: both
    wgmmas issued into one accumulator before one wait."""
    terms = [(hk.Smem(ds_s.at[w], transposed=True), hk.Smem(k_s.at[w, :, dw])) for w in range(WGS)]
    if ops.interpret:
        return sum(ops._dot(a, b) for a, b in terms)

    def scope(acc_ref):  # a fresh accumulator starts at zero
        for a, b in terms:
            ops._issue(acc_ref, a, b)
        return acc_ref[...]

    # run_scoped, not run_state: run_state returns the literal indices w that the terms close
    # over as outputs, which Mosaic GPU's warpgroup lowering (jax >= 0.11's default) rejects
    return pl.run_scoped(scope, plgpu.WGMMAAccumulatorRef(shape, F32))


def cta_dq_kernel(*refs, cfg: hbk.BwdConfig):
    """Grid ("h", "i", "b") over kv heads and key CTAs, warpgroups "wg". GMEM inputs as
    ``hbk.dkv_kernel``, then the dq accumulator f32 [B, H, Sq, D] (a Ref, added to). Out: dk, dv
    f32 [B, K, Sk, D]."""
    bounds, (q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref), (qp_ref, kp_ref), (qs_ref, ks_ref), \
        (dq_ref, dk_ref, dv_ref), scratch = hbk._split(refs, cfg, 3)
    (k_s, v_s, kp_s, ks_s, q_s, do_s, lse_s, dl_s, qp_s, qs_s, own_bar, loaded, free, ds_s,
     dq_s, ds_ready, ds_free) = scratch
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
        rows = pl.ds(i * (WGS * cfg.rows) + wg * cfg.rows, cfg.rows)
        own = hbk.load_keys(cfg, ops, b, kvh, wg, rows, (k_ref, v_ref, kp_ref, ks_ref),
                            (k_s, v_s, kp_s, ks_s), own_bar.at[wg])
        smem = (k_s, v_s, q_s, do_s, lse_s, dl_s, qp_s, qs_s)
        d = k_s.shape[2]
        dw = pl.ds(wg * (d // WGS), d // WGS)

        def body(j, carry, g, masked: bool):
            t = g * n + j - lo
            slot = lax.rem(t, jnp.int32(cfg.stages))
            plgpu.barrier_wait(loaded.at[slot])
            p_t, ds_t = hbk.kv_probs(cfg, ops, wg, slot, own, smem, masked)  # [r, c]
            ds_t = ds_t.astype(ds_s.dtype)
            pl.when(t > 0)(lambda: plgpu.barrier_wait(ds_free))  # both read the last ds^T
            ops.stage(ds_s.at[wg], ds_t)
            plgpu.barrier_arrive(ds_ready)
            carry = hbk.kv_update(ops, carry, p_t, ds_t, q_s.at[slot], do_s.at[slot])
            plgpu.barrier_arrive(free.at[slot])
            plgpu.barrier_wait(ds_ready)  # ds^T of both warpgroups written
            dq = _dq_half(ops, ds_s, k_s, dw, (cfg.block, d // WGS))  # [c, D/2]
            plgpu.barrier_arrive(ds_free)
            blk = hbk.visit(j, bounds, i, q_ref.shape[1] // cfg.block)
            h = kvh * cfg.groups + g
            ops.reduce_add(dq_s.at[wg], dq, dq_ref.at[b, h, pl.ds(blk * cfg.block, cfg.block), dw])
            return carry

        hbk.group_loop(cfg, ops, body, bounds, cfg.masked, d,
                       (dk_ref.at[b, kvh, rows], dv_ref.at[b, kvh, rows]))
        pl.when(n > 0)(lambda: plgpu.barrier_wait(ds_free))  # observe the last phase
        ops.flush()


def _scratch(d: int, dtype, stages: int, positions: bool, segments: bool):
    """The dk/dv kernel's buffers, ds^T per warpgroup, half a dq tile per warpgroup, then the
    barriers: ds^T of both written, ds^T of both read."""
    tiles = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))  # 16-bit, 128 bytes
    f32_tiles = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))
    return [*hb._scratch(ROWS, ROWS, d, dtype, stages, 0, 2, positions, segments),
            plgpu.SMEM((WGS, ROWS, ROWS), dtype, transforms=tiles),  # ds^T [r keys, c queries]
            plgpu.SMEM((WGS, ROWS, d // WGS), F32, transforms=f32_tiles),  # dq half tile
            plgpu.Barrier(num_arrivals=WGS), plgpu.Barrier(num_arrivals=WGS)]


def smem_bytes(d: int, dtype, stages: int) -> int:
    """Shared memory of the tiles (k, v own; q, do streamed; ds^T; dq staging), ints excluded."""
    tiles = 2 * (WGS + stages) * ROWS * d * jnp.dtype(dtype).itemsize
    return tiles + WGS * ROWS * (ROWS * jnp.dtype(dtype).itemsize + d // WGS * 4)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _run(lo, mid, hi, q, k, v, do, lse2, delta, *extra, cfg: hbk.BwdConfig):
    """Padded inputs -> unscaled dq f32 [B, H, Sq, D], dk, dv f32 [B, K, Sk, D]."""
    B, sq, H, d = q.shape
    sk, K = k.shape[1], k.shape[2]
    dq_acc = jax.new_ref(jnp.zeros((B, H, sq, d), F32), memory_space=plgpu.GMEM)
    out = jax.ShapeDtypeStruct((B, K, sk, d), F32)
    dk, dv = hfb._launch(functools.partial(cta_dq_kernel, cfg=cfg), (out, out),
                         _scratch(d, q.dtype, cfg.stages, cfg.positions, cfg.segments),
                         grid=(K, sk // CTA, B), interpret=cfg.interpret)(lo, mid, hi, q, k, v, do,
                                                                         lse2, delta, *extra, dq_acc)
    return dq_acc[...], dk, dv


def backward(q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, *, bs, causal: bool,
             softmax_scale: float, interpret: bool, window: int | None = None):
    """float32 dq [B, Sq, H, D], dk, dv [B, Sk, K, D] (contract in ``implementations.py``)."""

    def check(D: int, d: int):
        if d != 128:  # each warpgroup's half of the columns must be whole 64-column tiles
            raise ValueError(f"pallas_hopper dq_tile='cta': head dim {D} (padded {d}) must pad to 128")
        smem = smem_bytes(d, q.dtype, bs.bwd_stages)
        if smem > hb.SMEM_LIMIT - 4096:
            raise ValueError(f"pallas_hopper backward='fused', dq_tile='cta': head dim {D} with "
                             f"bwd_stages={bs.bwd_stages} needs {smem} bytes of shared memory (limit "
                             f"{hb.SMEM_LIMIT}); use fewer bwd_stages")

    return hfb.key_cta_backward(_run, check, q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg,
                                bs=bs, causal=causal, softmax_scale=softmax_scale,
                                interpret=interpret, window=window)
