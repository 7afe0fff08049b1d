"""``overlap_dq.py``'s two orders (dq's wgmmas issued while dk, dv are in flight) with the loops'
wgmma descriptors built inside the loop (``BlockSizes(loop_descriptors=True)``; 2026-12-04, fourth
session, prepared without a device).

In ``../hopper_runs_1204c/`` both orders ran 2-9% slower than the library, with more spills and
three C7519 notes from ptxas ("warpgroup.arrive is injected ... to allow use of registers in
GMMA"). Compiled for an H200 on a CPU machine (``benchmarks/hopper_aot.py``), the library's spills
came from the loop-invariant descriptors LLVM hoists out of the pair loop; with them built in the
loop, the library spills nothing. These variants are the two orders with every own-tile index
passed through ``cfg.own`` (the library's ``_split_columns`` does that already):

* ``library``: ``hopper_cta_dq_bwd._split_columns`` as shipped;
* ``overlap``: dv, dk issued, ds^T of both awaited, the dq half issued, one wait for dv, dk, one
  for dq;
* ``fa3``: dv issued, ds^T of both awaited, the dq half issued, then dk; dq awaited with dk in
  flight.

The ``loop_descriptors`` field comes from the backward's block sizes, so a run names both:

  PYTHONPATH=. python3 benchmarks/results/hopper_aot_1204/overlap_ld.py \\
      --backwards default,default/loop_descriptors=true --variants library,overlap,fa3 \\
      --problems 32:32:128@16384+131072,32:8:128@131072 --rounds 3 --out $OUT/overlap_ld

and ``hopper_aot.py --variant overlap_ld:fa3 --variant-dir benchmarks/results/hopper_aot_1204
--backward default/loop_descriptors=true`` compiles one without a device. Interpret mode computes
the library's sums in its order.
"""

from __future__ import annotations

import sys

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, "benchmarks/results/hopper_runs_1203c")
import kv_init  # noqa: E402

from ringattention.kernels import hopper_cta_dq_bwd as hcb  # noqa: E402
from ringattention.kernels import hopper_kernels as hk  # noqa: E402

F32 = jnp.float32
LIBRARY = hcb._split_columns


def _variant(order: str):
    """``_split_columns`` with the pair's wgmmas issued in ``order`` ("overlap" or "fa3")."""

    def split_columns(c):
        cfg, ops, wg = c.cfg, c.ops, c.wg
        k_s, _, q_s, do_s = c.smem[:4]
        ds_s, dq_s, ds_ready, ds_free = c.scratch[:4]
        lo, d = c.bounds[0], k_s.shape[2]
        dw = pl.ds(wg * (d // hcb.WGS), d // hcb.WGS)
        shape = (cfg.block, d // hcb.WGS)

        def add_dq(dq, j, g):
            plgpu.barrier_arrive(ds_free)
            h, rows_q = c.dq_rows(j, g)
            ops.reduce_add(dq_s.at[wg], dq, c.outs[0].at[c.b, rows_q, h, dw])

        def body(j, carry, g, masked: bool):
            t = g * c.n + j - lo
            slot, p_t, ds_t = c.probs(t, masked, j)  # [r, c]
            pl.when(t > 0)(lambda: plgpu.barrier_wait(ds_free))
            ops.stage(ds_s.at[wg], ds_t)
            plgpu.barrier_arrive(ds_ready)
            q_t, do_t = hk.Smem(q_s.at[slot]), hk.Smem(do_s.at[slot])
            p16, ds16 = p_t.astype(q_s.dtype), ds_t.astype(q_s.dtype)
            own = lambda w: cfg.own(w, j)  # noqa: E731
            if ops.interpret:  # the library's sums
                dk, dv = carry
                dv, dk = dv + ops._dot(p16, do_t), dk + ops._dot(ds16, q_t)
                plgpu.barrier_arrive(c.free.at[slot])
                plgpu.barrier_wait(ds_ready)
                add_dq(hcb._dq_half(ops, ds_s, k_s, dw, shape, own), j, g)
                return dk, dv

            def scope(dk_ref, dv_ref, dq_ref):
                dk_ref[...], dv_ref[...] = carry
                ops._issue(dv_ref, p16, do_t)
                if order == "overlap":
                    ops._issue(dk_ref, ds16, q_t)
                plgpu.barrier_wait(ds_ready)  # ds^T of both warpgroups written
                for w in range(hcb.WGS):
                    ops._issue(dq_ref, hk.Smem(ds_s.at[own(w)], transposed=True),
                               hk.Smem(k_s.at[own(w), :, dw]))
                if order == "overlap":
                    plgpu.wgmma_wait(2)  # dv, dk
                    plgpu.barrier_arrive(c.free.at[slot])
                    add_dq(plgpu.wgmma_accumulator_load(dq_ref, wait_n=0), j, g)
                else:
                    ops._issue(dk_ref, ds16, q_t)
                    add_dq(plgpu.wgmma_accumulator_load(dq_ref, wait_n=1), j, g)  # dk in flight
                    plgpu.wgmma_wait(0)
                    plgpu.barrier_arrive(c.free.at[slot])
                return (plgpu.wgmma_accumulator_load(dk_ref, wait_n=None),
                        plgpu.wgmma_accumulator_load(dv_ref, wait_n=None))

            acc = plgpu.WGMMAAccumulatorRef((cfg.rows, d), F32)
            return pl.run_scoped(scope, acc, acc, plgpu.WGMMAAccumulatorRef(shape, F32))

        c.loop(body)
        pl.when(c.n > 0)(lambda: plgpu.barrier_wait(ds_free))  # observe the last phase
        ops.flush()

    return split_columns


VARIANTS = {"library": LIBRARY, "overlap": _variant("overlap"), "fa3": _variant("fa3")}


def use(name: str) -> None:
    hcb._split_columns = VARIANTS[name]


kv_init.USE["variant"] = use
kv_init.VARIANTS = VARIANTS

if __name__ == "__main__":
    kv_init.main()
