# Archived experiment (benchmarks/results/pallas_hopper_h200.md, 2026-12-01 night): run as
# devrun/rows_layout.py from the repository root over commit 675d262 (it patches the library at run
# time, then runs benchmarks/hopper_check.py). Not part of the library; kept to reproduce.
"""Experiment (next lease): the head-dim-128 one-dq-tile-per-CTA backward with FlashAttention-3's
tile orientation where nothing is masked: queries as rows (s = q k_w^T, dp = do v_w^T, [c, r]), so
lse and delta are row vectors (2 registers per thread instead of 16 each for column vectors); p and
ds go to shared memory (bf16) and dv += p^T do, dk += ds^T q read them transposed from there (no
16-bit register copies pinned during those wgmmas). Masks (causal, ids, windows) compare the
streamed queries' positions / ids (row vectors) with the own keys' (column vectors).

  import devrun.rows_layout  # patches hopper_cta_dq_bwd in this process
  python3 devrun/rows_layout.py ARGS  # then runs benchmarks/hopper_check.py ARGS

Checked on CPU: interpret mode against the reference, CUDA lowering under both semantics
(``python3 devrun/rows_layout.py --selftest``).
"""
import runpy
import sys

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ringattention.kernels import hopper_bwd_kernels as hbk
from ringattention.kernels import hopper_cta_dq_bwd as hcd
from ringattention.kernels import hopper_fused_bwd as hfb
from ringattention.kernels import hopper_kernels as hk

WGS = hk.COMPUTE_WGS
ROWS = hcd.ROWS
F32 = jnp.float32
_orig_split, _orig_scratch, _orig_load_keys = hcd._split_columns, hcd._scratch, hbk.load_keys


class Own(tuple):
    """(positions, ids) as row vectors, as ``hbk.load_keys`` returns them, plus ``refs``: their
    SMEM refs, which the rows orientation reads as column vectors."""

    refs: tuple


def load_keys(cfg, ops, b, kvh, wg, rows, gmem, smem, bar):
    own = Own(_orig_load_keys(cfg, ops, b, kvh, wg, rows, gmem, smem, bar))
    _, _, kp_s, ks_s = smem
    own.refs = (kp_s.at[wg] if cfg.positions else None, ks_s.at[wg] if cfg.segments else None)
    return own


def _vis_rows(cfg, ops, shape, slot, q_refs, k_refs):
    """bool [c queries, r own keys] visibility (streamed rows x own columns)."""
    (qp_s, qs_s), (kp, ks) = q_refs, k_refs
    row = lambda ref: lax.broadcast_in_dim(ops.rows(ref.at[slot]), shape, [0])  # noqa: E731
    col = lambda ref: lax.broadcast_in_dim(ops.cols(ref), shape, [1])  # noqa: E731
    vis = None
    if cfg.causal:
        vis = col(kp) <= row(qp_s)
    if cfg.window is not None:
        near = hk.window_mask(cfg.causal, cfg.window, row(qp_s), col(kp))
        vis = near if vis is None else vis & near
    if cfg.segments:
        same = row(qs_s) == col(ks)
        vis = same if vis is None else vis & same
    return vis


def _dq_half_rows(ops, ds_s, k_s, dw, shape):
    """float32 [c, D/2] = sum_w ds_w [c, r] @ k_w[:, dw] (ds stored as [queries, keys])."""
    terms = [(hk.Smem(ds_s.at[w]), hk.Smem(k_s.at[w, :, dw])) for w in range(WGS)]
    if ops.interpret:
        return sum(ops._dot(a, b) for a, b in terms)

    def scope(acc_ref):
        for a, b in terms:
            ops._issue(acc_ref, a, b)
        return acc_ref[...]

    return pl.run_scoped(scope, plgpu.WGMMAAccumulatorRef(shape, F32))


def _rows(c: hfb.KeyCta):
    cfg, ops, wg = c.cfg, c.ops, c.wg
    k_s, v_s, q_s, do_s, lse_s, dl_s, qp_s, qs_s = c.smem
    ds_s, dq_s, ds_ready, ds_free, p_s = c.scratch
    lo, d = c.bounds[0], k_s.shape[2]
    dw = pl.ds(wg * (d // WGS), d // WGS)

    def body(j, carry, g, masked: bool):
        t = g * c.n + j - lo
        slot = lax.rem(t, jnp.int32(cfg.stages))
        plgpu.barrier_wait(c.loaded.at[slot])

        def probs(s):  # raw logits [c queries, r keys] -> probabilities, 0 where hidden
            p = jnp.exp2(s * cfg.qk_scale
                         - lax.broadcast_in_dim(ops.rows(lse_s.at[slot]), s.shape, [0]))
            if not masked:
                return p
            return jnp.where(_vis_rows(cfg, ops, s.shape, slot, (qp_s, qs_s), c.own.refs), p, 0.0)

        p, dp = ops.pair((hk.Smem(q_s.at[slot]), hk.Smem(k_s.at[wg], transposed=True)),
                         (hk.Smem(do_s.at[slot]), hk.Smem(v_s.at[wg], transposed=True)),
                         (cfg.block, cfg.rows), probs)
        ds = p * (dp - lax.broadcast_in_dim(ops.rows(dl_s.at[slot]), dp.shape, [0]))
        ops.stage(p_s.at[wg], p.astype(q_s.dtype))  # own buffer: the last dv wgmma has read it
        pl.when(t > 0)(lambda: plgpu.barrier_wait(ds_free))  # both read the last ds
        ops.stage(ds_s.at[wg], ds.astype(q_s.dtype))
        plgpu.barrier_arrive(ds_ready)
        dk, dv = carry
        dv, dk = ops.mma((dv, hk.Smem(p_s.at[wg], transposed=True), hk.Smem(do_s.at[slot])),
                         (dk, hk.Smem(ds_s.at[wg], transposed=True), hk.Smem(q_s.at[slot])))
        plgpu.barrier_arrive(c.free.at[slot])
        plgpu.barrier_wait(ds_ready)  # ds of both warpgroups written
        dq = _dq_half_rows(ops, ds_s, k_s, dw, (cfg.block, d // WGS))  # [c, D/2]
        plgpu.barrier_arrive(ds_free)
        h, rows_q = c.dq_rows(j, g)
        ops.reduce_add(dq_s.at[wg], dq, c.outs[0].at[c.b, h, rows_q, dw])
        return dk, dv

    c.loop(body)
    pl.when(c.n > 0)(lambda: plgpu.barrier_wait(ds_free))
    ops.flush()


def _scratch(d, dtype, stages, positions, segments):
    out = _orig_scratch(d, dtype, stages, positions, segments)
    if d == 64:
        return out
    tiles = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    return [*out, plgpu.SMEM((WGS, ROWS, ROWS), dtype, transforms=tiles)]  # p [c, r] per warpgroup


hcd._split_columns, hcd._scratch, hbk.load_keys = _rows, _scratch, load_keys


def selftest():
    import functools

    import jax
    import numpy as np

    from ringattention.kernels import pallas_gpu as pg
    from ringattention.kernels import pallas_hopper as ph

    rng = np.random.default_rng(0)
    for heads, kvh, sq, sk, causal, seg, window in (
            (4, 2, 72, 136, False, False, None), (2, 2, 136, 200, False, False, None),
            (4, 2, 72, 136, True, False, None), (4, 2, 200, 328, True, True, None),
            (2, 1, 136, 264, False, True, 100), (2, 2, 72, 200, True, False, 90)):
        f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.bfloat16)  # noqa: E731
        q, do, k, v = f(1, sq, heads, 128), f(1, sq, heads, 128), f(1, sk, kvh, 128), f(1, sk, kvh, 128)
        qp, kp = jnp.arange(sq, dtype=jnp.int32) + sk // 2, jnp.arange(sk, dtype=jnp.int32)
        ids = lambda n: jnp.asarray(np.sort(rng.integers(0, 3, (1, n)), axis=1), jnp.int32)  # noqa: E731
        qs, ks = (ids(sq), ids(sk)) if seg else (None, None)
        kw = dict(causal=causal, softmax_scale=128**-0.5, window=window)
        ro, rlse = pg.reference_forward_step(q, k, v, qp, kp, qs, ks, **kw)
        delta = jnp.einsum("bshd,bshd->bhs", ro, do.astype(F32))
        got = ph.backward_step(q, k, v, do, rlse, delta, qp, kp, qs, ks, interpret=True, **kw)
        want = pg.reference_backward_step(q, k, v, do, rlse, delta, qp, kp, qs, ks, **kw)
        errs = [float(jnp.linalg.norm(g - w) / jnp.linalg.norm(w)) for g, w in zip(got, want)]
        print(f"interpret {heads}:{kvh} sq={sq} sk={sk} causal={causal} ids={seg} window={window}:"
              " dq dk dv rel err",
              " ".join(f"{e:.2e}" for e in errs), "PASS" if max(errs) < 2e-2 else "FAIL")
    for sem in ("default", "warpgroup"):
        jax.clear_caches()
        if sem == "warpgroup":
            plgpu.CompilerParams = functools.partial(
                plgpu.CompilerParams, lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
        s = jax.ShapeDtypeStruct
        q, k = s((1, 384, 4, 128), jnp.bfloat16), s((1, 384, 2, 128), jnp.bfloat16)
        pos, lse, ids = s((384,), jnp.int32), s((1, 4, 384), F32), s((1, 384), jnp.int32)
        for causal, seg, window in ((False, False, None), (True, True, None), (False, True, 100)):

            def bwd(q, k, v, do, lse, delta, p, i):
                i = i if seg else None
                return ph.backward_step(q, k, v, do, lse, delta, p, p, i, i, causal=causal,
                                        softmax_scale=0.1, window=window)

            text = jax.jit(bwd).trace(q, k, k, q, lse, lse, pos, ids).lower(
                lowering_platforms=("cuda",)).as_text()
            print(f"lowered ({sem}, causal={causal} ids={seg} window={window}): "
                  f"{text.count('stablehlo.custom_call @mosaic_gpu')} Mosaic GPU call")


if __name__ == "__main__":
    if sys.argv[1:] == ["--selftest"]:
        selftest()
    else:
        sys.argv = ["hopper_check.py", *sys.argv[1:]]
        runpy.run_path("benchmarks/hopper_check.py", run_name="__main__")
