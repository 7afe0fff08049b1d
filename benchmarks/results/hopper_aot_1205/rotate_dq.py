"""Head dim 128's default backward with each pair's dq reduce-add moved behind the next pair's
s^T and dp^T wgmmas (2026-12-05, no device: compiled for an H200 and checked in interpret mode).

In ``hopper_cta_dq_bwd._split_columns`` a warpgroup's wgmma queue is empty from the moment its dq
half tile lands until the next pair's s^T and dp^T are issued. In that gap it waits for its last
TMA reduce-add to have read the staging tile, stores the tile to shared memory (a swizzled float32
store), fences it for the async proxy and issues the reduce-add, with four warpgroup barriers on
the way (``../hopper_aot_1204/`` has the loop's SASS). Both warpgroups reach that gap together,
since each waits for the other's ds^T before dq, so the tensor cores idle through it. The orders
of ``../hopper_runs_1204c/overlap_dq.py`` hide it behind dk's wgmma at most (``fa3``). Here the
loop is rotated as FlashAttention-3's forward is (``hopper_fwd_loops.overlap_loops``): pair t
issues pair t + 1's s^T and dp^T (they need only the next query slot and the own tiles) right
after its dq half, adds dq while they run, and hands their landed products to the next trip in
the loop carry. Variants of ``_split_columns``, monkeypatched in:

* ``library``: as shipped;
* ``rotate``: dv, dk issued and awaited (the library's order), then dq, then s^T and dp^T of the
  next pair; dq awaited with both in flight, staged and reduce-added, then both awaited;
* ``rotate_overlap``: ``rotate`` with dv, dk and dq issued before one wait (``overlap``'s order);
* ``rotate_s``: only s^T issued before the add (32 accumulator registers in flight, not 64),
  dp^T after it;
* ``rotate_0``: both issued after the add: the carry of the landed products alone, nothing
  overlapped (a control for what the carry costs).

The first pair's products are computed before the loops; past the last pair the last slot is
read again and the values go unused. The sums are the library's in the same order: in interpret
mode the dq, dk, dv of ``rotate``, ``rotate_s`` and ``rotate_overlap`` are bit for bit the
library's (``--interpret``, 4:2:128 at 256 tokens, causal and full: ``interpret_rotate.txt``;
also 2:2:128 and 4:2:128 at 512 for an earlier form, not kept, that held dq's wgmma in flight
across the loop's back edge).

**Result (compile only, ``rotate.md``):** none of them fits. With ``loop_descriptors`` ptxas
serializes every wgmma of the kernel (C7512, "insufficient register resources": 64 warpgroup
arrives and waits per trip, against 11 in the library) and spills 384-640 bytes (456-728
without the flag, where the library spills 112-336 and nothing with it), ``rotate_0`` included: dk, dv (128
registers) plus the carried s^T, dp^T (64) leave no room at head dim 128. The earlier form (dq's
accumulator live across the back edge) was serialized too (C7514: "non wgmma instructions reading
accumulator registers"). Not planned for a lease.

  PYTHONPATH=. python3 benchmarks/results/hopper_aot_1205/rotate_dq.py --backwards default \\
      --problems 32:32:128@16384 --variants library,rotate --rounds 3 --out $OUT/rotate_dq

(``../hopper_runs_1203c/kv_init.py``'s harness: bare backward step, rounds in rotated order,
gradients compared with the library's.)
"""

from __future__ import annotations

import functools
import sys

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, "benchmarks/results/hopper_runs_1203c")
import kv_init  # noqa: E402

from ringattention.kernels import hopper_bwd_kernels as hbk  # noqa: E402
from ringattention.kernels import hopper_cta_dq_bwd as hcb  # noqa: E402
from ringattention.kernels import hopper_fused_bwd as hfb  # noqa: E402
from ringattention.kernels import hopper_kernels as hk  # noqa: E402

F32 = jnp.float32
LIBRARY = hcb._split_columns


def _loops(c, body, init):
    """``hbk.group_loop``'s walk over the group's (head, block) pairs with a carry of one's own:
    ``body(j, carry, g, masked)``; returns the last carry (dk, dv are written by the caller)."""
    cfg, bounds = c.cfg, c.bounds
    lo, n = bounds[0], bounds[2] - bounds[0]

    def head(g, carry):
        return hbk.block_loops(functools.partial(body, g=g), bounds, cfg.masked, carry)

    def pair(t, carry):
        return body(lo + lax.rem(t, n), carry, g=lax.div(t, n), masked=False)

    if cfg.groups == 1:
        return head(jnp.int32(0), init)
    if hbk.nothing_masked(bounds, cfg.masked):
        return lax.fori_loop(0, cfg.groups * n, pair, init)
    return lax.fori_loop(0, cfg.groups, head, init)


def _variant(overlap: bool, ahead: int = 2):
    """``_split_columns`` with pair t's dq reduce-add behind pair t + 1's s^T, dp^T."""

    def split_columns(c):
        cfg, ops, wg = c.cfg, c.ops, c.wg
        k_s, v_s, q_s, do_s, lse_s, dl_s, qp_s, qs_s = c.smem
        ds_s, dq_s, ds_ready, ds_free = c.scratch[:4]
        lo, d = c.bounds[0], k_s.shape[2]
        dw = pl.ds(wg * (d // hcb.WGS), d // hcb.WGS)
        shape, tile = (cfg.block, d // hcb.WGS), (cfg.rows, cfg.block)
        total = c.n * cfg.groups

        def products(t, j):
            """s^T, dp^T [r keys, c queries] of pair t (own tiles indexed with ``cfg.own(., j)``);
            past the last pair, the last pair's slot again (not awaited; the values go unused)."""
            slot = lax.rem(jnp.minimum(t, total - 1), jnp.int32(cfg.stages))
            pl.when(t < total)(lambda: plgpu.barrier_wait(c.loaded.at[slot]))
            own = cfg.own(wg, j)
            return ((hk.Smem(k_s.at[own]), hk.Smem(q_s.at[slot], transposed=True)),
                    (hk.Smem(v_s.at[own]), hk.Smem(do_s.at[slot], transposed=True)))

        def probs(slot, s_t, dp_t, masked: bool):  # hbk.kv_probs after the wgmmas
            wide = lambda ref: lax.broadcast_in_dim(ops.cols(ref.at[slot]), tile, [1])  # noqa: E731
            p_t = jnp.exp2(s_t * cfg.qk_scale - wide(lse_s))
            if masked:
                at = lambda r: None if r is None else r.at[slot]  # noqa: E731
                p_t = jnp.where(hbk._vis(cfg, ops, tile, *c.own, at(qp_s), at(qs_s), False),
                                p_t, 0.0)
            return p_t, (p_t * (dp_t - wide(dl_s))).astype(q_s.dtype)

        def add(dq, h, rows_q):
            plgpu.barrier_arrive(ds_free)
            ops.reduce_add(dq_s.at[wg], dq, c.outs[0].at[c.b, rows_q, h, dw])

        def body(j, carry, g, masked: bool):
            dk, dv, s_t, dp_t = carry  # s^T, dp^T of this pair, landed last pair
            t = g * c.n + j - lo
            slot = lax.rem(t, jnp.int32(cfg.stages))
            p_t, ds_t = probs(slot, s_t, dp_t, masked)
            pl.when(t > 0)(lambda: plgpu.barrier_wait(ds_free))  # both read the last ds^T
            ops.stage(ds_s.at[wg], ds_t)
            plgpu.barrier_arrive(ds_ready)
            p16 = p_t.astype(q_s.dtype)
            q_t, do_t = hk.Smem(q_s.at[slot]), hk.Smem(do_s.at[slot])
            h, rows_q = c.dq_rows(j, g)
            own = lambda w: cfg.own(w, j)  # noqa: E731
            nxt = products(t + 1, j)
            if ops.interpret:
                dv, dk = dv + ops._dot(p16, do_t), dk + ops._dot(ds_t, q_t)
                plgpu.barrier_arrive(c.free.at[slot])
                plgpu.barrier_wait(ds_ready)
                dq = hcb._dq_half(ops, ds_s, k_s, dw, shape, own)
                s_t, dp_t = ops._dot(*nxt[0]), ops._dot(*nxt[1])
                add(dq, h, rows_q)
                return dk, dv, s_t, dp_t

            # each accumulator is allocated where its first wgmma is issued: Mosaic GPU zeroes a
            # fresh one, and zeros held across the other products would cost 64 registers
            def next_pair(dq_ref, s_ref, dp_ref):
                if ahead >= 1:
                    ops._issue(s_ref, *nxt[0])  # the next pair's products run while dq is added
                if ahead == 2:
                    ops._issue(dp_ref, *nxt[1])
                add(plgpu.wgmma_accumulator_load(dq_ref, wait_n=ahead), h, rows_q)
                if ahead == 0:
                    ops._issue(s_ref, *nxt[0])
                if ahead <= 1:
                    ops._issue(dp_ref, *nxt[1])
                plgpu.wgmma_wait(0)
                return s_ref[...], dp_ref[...]

            def with_dq(dq_ref):
                plgpu.barrier_wait(ds_ready)  # ds^T of both warpgroups written
                for w in range(hcb.WGS):
                    ops._issue(dq_ref, hk.Smem(ds_s.at[own(w)], transposed=True),
                               hk.Smem(k_s.at[own(w), :, dw]))
                if overlap:
                    plgpu.wgmma_wait(2)  # dv, dk; dq in flight
                    plgpu.barrier_arrive(c.free.at[slot])
                acc = plgpu.WGMMAAccumulatorRef(tile, F32)
                return pl.run_scoped(functools.partial(next_pair, dq_ref), acc, acc)

            def scope(dk_ref, dv_ref):
                dk_ref[...], dv_ref[...] = dk, dv
                ops._issue(dv_ref, p16, do_t)
                ops._issue(dk_ref, ds_t, q_t)
                if not overlap:  # the library's order: dv, dk land before dq is issued
                    plgpu.wgmma_wait(0)
                    plgpu.barrier_arrive(c.free.at[slot])
                s_t, dp_t = pl.run_scoped(with_dq, plgpu.WGMMAAccumulatorRef(shape, F32))
                return (plgpu.wgmma_accumulator_load(dk_ref, wait_n=None),
                        plgpu.wgmma_accumulator_load(dv_ref, wait_n=None), s_t, dp_t)

            acc = plgpu.WGMMAAccumulatorRef((cfg.rows, d), F32)
            return pl.run_scoped(scope, acc, acc)

        zeros = ops.full((cfg.rows, d), 0.0)
        first = products(jnp.int32(0), lo)  # pair 0's products, before the loops
        if ops.interpret:
            s_0, dp_0 = ops._dot(*first[0]), ops._dot(*first[1])
        else:
            s_0, dp_0 = ops.mma((tile, *first[0]), (tile, *first[1]))
        dk, dv, _, _ = _loops(c, body, (zeros, zeros, s_0, dp_0))
        _, dk_ref, dv_ref = c.outs
        at = (c.b, c.kvh, c.rows) if hfb.dkv_head_major(d) else (c.b, c.rows, c.kvh)
        dk_ref.at[at][...] = dk * cfg.scale
        dv_ref.at[at][...] = dv
        pl.when(c.n > 0)(lambda: plgpu.barrier_wait(ds_free))  # observe the last phase
        ops.flush()

    return split_columns


VARIANTS = {"library": LIBRARY, "rotate": _variant(False), "rotate_overlap": _variant(True),
            "rotate_s": _variant(False, ahead=1), "rotate_0": _variant(False, ahead=0)}


def use(name: str) -> None:
    hcb._split_columns = VARIANTS[name]


kv_init.USE["variant"] = use
kv_init.VARIANTS = VARIANTS

if __name__ == "__main__":
    kv_init.main()
