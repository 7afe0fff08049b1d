"""Head dim 128's default backward with its waits and its dq staging moved off the path between
the wgmmas (2026-12-05, no device: compiled for an H200 and checked in interpret mode, for the
next lease).

In ``hopper_cta_dq_bwd._split_columns`` each pair, per compute warpgroup, runs: s^T and dp^T
(wgmma), the probabilities, then

1. ds^T staged to shared memory for dq (a store, a fence for the async proxy, three warpgroup
   barriers, ``FusedOps.stage``), then dv += p^T do and dk += ds^T q issued and awaited. Those two
   read p^T and ds^T from registers, not the staged tile, yet are issued only after the fence;
2. the dq half tile issued and awaited, then ``FusedOps.reduce_add``: a wait until the previous
   pair's TMA reduce-add has read the staging tile (and a barrier), the store, the fence, the
   reduce-add, all with no wgmma of the warpgroup in flight.

Both warpgroups of a key CTA meet at the ds^T barrier every pair, so whatever one runs with no
wgmma in flight the tensor cores idle through (the loop's SASS: ``../hopper_aot_1204/``).
Variants of ``_split_columns``, monkeypatched in:

* ``library``: as shipped;
* ``late``: dv, dk issued first, ds^T staged (and its barrier arrived) while they run;
* ``early_wait``: the wait for the staging tile's last read issued while dq's wgmmas run;
* ``late_early_wait``: both;
* ``dq_first``: ds^T staged, then dq's half tile, dv and dk issued back to back; dq awaited with
  dv, dk in flight and staged and reduce-added while they run; then dv, dk awaited;
* ``dv_dq_dk``: FlashAttention-3's order (``../hopper_runs_1204c/overlap_dq.py``'s ``fa3``) with
  ds^T staged while dv runs: dv, then (ds^T of both written) dq, then dk; dq added while dk runs.
* ``overlap_nested``, ``fa3_nested``: ``overlap_dq.py``'s two orders (ds^T staged first; dv, dk,
  then dq / dv, dq, dk) with dq's accumulator allocated where dq is issued, imported from there so
  that one run times all of them.

The sums and their order are the library's: in interpret mode the gradients are bit for bit the
library's (``--interpret``, 4:2:128 at 256 tokens and 2:2:128 at 384, causal and full, with and
without ``loop_descriptors``; the nested orders at 4:2:128: ``interpret_stage.txt``). Interpret
mode runs each variant's interpret branch, the library's sums in the library's order: it checks
the barriers, the indexing and the sums, not the wgmma issue order, which only the device check
does. Compiled for an H200 (``stage.md``, ``order.md``) with ``loop_descriptors`` none spills,
draws a C7519 or serialization note, or runs more than 3 more instructions per trip than the
library (32:32:128 and 32:8:128 causal, 32:32:128 full); without the flag ``dq_first`` spills
more than the library (348 / 380 bytes against 296 / 336 causal). Each accumulator is allocated
where its first wgmma is issued: ``dq_first`` with dq's allocated next to dk's and dv's (as
``overlap_dq.py`` allocates it) drew a C7519 note, ptxas's injected warpgroup arrive for
registers written after the last fence (there, the fresh accumulator's zeros).
``overlap_dq.py``'s orders, which allocate it that way, draw one such note per loop; with it
allocated where dq is issued (``*_nested``) they draw none and run 15-19 fewer instructions per
trip (``order.md``).
Timed like ``overlap_dq.py`` (``../hopper_runs_1203c/kv_init.py``'s harness: bare backward,
rounds in rotated order, gradients compared with the library's):

  PYTHONPATH=. python3 benchmarks/results/hopper_aot_1205/stage_ds.py \\
      --backwards default/loop_descriptors=true \\
      --problems 32:32:128@16384+65536,32:8:128@65536 \\
      --variants library,late_early_wait,dq_first,dv_dq_dk,overlap_nested,fa3_nested \\
      --rounds 3 --out $OUT/stage_ds
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

sys.path.insert(0, "benchmarks/results/hopper_runs_1204c")
import overlap_dq  # noqa: E402  (sets kv_init's registry too: this module's is set last, below)

F32 = jnp.float32
LIBRARY = hcb._split_columns


def _dq_half(ops, ds_s, k_s, dw, shape, own, in_flight):
    """``hcb._dq_half`` with ``in_flight()`` run between the issue and the wait."""
    terms = [(hk.Smem(ds_s.at[own(w)], transposed=True), hk.Smem(k_s.at[own(w), :, dw]))
             for w in range(hcb.WGS)]
    if ops.interpret:
        in_flight()
        return sum(ops._dot(a, b) for a, b in terms)

    def scope(acc_ref):
        for a, b in terms:
            ops._issue(acc_ref, a, b)
        in_flight()
        return acc_ref[...]

    return pl.run_scoped(scope, plgpu.WGMMAAccumulatorRef(shape, F32))


def _variant(late: bool, early_wait: bool):
    def split_columns(c):
        cfg, ops, wg = c.cfg, c.ops, c.wg
        k_s, _, q_s, do_s = c.smem[:4]
        ds_s, dq_s, ds_ready, ds_free = c.scratch[:4]
        lo, d = c.bounds[0], k_s.shape[2]
        dw = pl.ds(wg * (d // hcb.WGS), d // hcb.WGS)
        shape = (cfg.block, d // hcb.WGS)

        def await_staging():  # the previous pair's reduce-add has read the staging tile
            if not ops.interpret:
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)

        def body(j, carry, g, masked: bool):
            t = g * c.n + j - lo
            slot, p_t, ds_t = c.probs(t, masked, j)  # [r, c]

            def stage():
                pl.when(t > 0)(lambda: plgpu.barrier_wait(ds_free))  # both read the last ds^T
                ops.stage(ds_s.at[wg], ds_t)
                plgpu.barrier_arrive(ds_ready)

            if not late:
                stage()
                carry = hcb._kv_update(c, carry, p_t, ds_t, ds_s.at[wg], slot)
            elif ops.interpret:
                stage()
                dk, dv = carry
                dv = dv + ops._dot(p_t.astype(q_s.dtype), hk.Smem(do_s.at[slot]))
                carry = dk + ops._dot(ds_t, hk.Smem(q_s.at[slot])), dv
            else:
                def scope(dk_ref, dv_ref):
                    dk_ref[...], dv_ref[...] = carry
                    ops._issue(dv_ref, p_t.astype(q_s.dtype), hk.Smem(do_s.at[slot]))
                    ops._issue(dk_ref, ds_t, hk.Smem(q_s.at[slot]))
                    stage()  # dv, dk read p^T, ds^T from registers: staging runs beside them
                    return (plgpu.wgmma_accumulator_load(dk_ref, wait_n=0),
                            plgpu.wgmma_accumulator_load(dv_ref, wait_n=None))

                acc = plgpu.WGMMAAccumulatorRef((cfg.rows, d), F32)
                carry = pl.run_scoped(scope, acc, acc)
            plgpu.barrier_arrive(c.free.at[slot])
            plgpu.barrier_wait(ds_ready)  # ds^T of both warpgroups written
            dq = _dq_half(ops, ds_s, k_s, dw, shape, lambda w: cfg.own(w, j),
                          await_staging if early_wait else lambda: None)  # [c, D/2]
            plgpu.barrier_arrive(ds_free)
            h, rows_q = c.dq_rows(j, g)
            gmem = c.outs[0].at[c.b, rows_q, h, dw]
            if not early_wait:
                ops.reduce_add(dq_s.at[wg], dq, gmem)
            elif ops.interpret:
                gmem[...] = gmem[...] + dq
            else:  # FusedOps.reduce_add after its wait
                ops.stage(dq_s.at[wg], dq)
                plgpu.copy_smem_to_gmem(dq_s.at[wg], gmem, reduction_op="add")
            return carry

        c.loop(body)
        pl.when(c.n > 0)(lambda: plgpu.barrier_wait(ds_free))  # observe the last phase
        ops.flush()

    return split_columns


def _dq_first(split_dv: bool):
    """dq's half tile issued before dv and dk (``split_dv``: dv issued first, ds^T staged while it
    runs, then dq, then dk), its staging and reduce-add running while they are in flight."""

    def split_columns(c):
        cfg, ops, wg = c.cfg, c.ops, c.wg
        k_s, _, q_s, do_s = c.smem[:4]
        ds_s, dq_s, ds_ready, ds_free = c.scratch[:4]
        lo, d = c.bounds[0], k_s.shape[2]
        dw = pl.ds(wg * (d // hcb.WGS), d // hcb.WGS)
        shape = (cfg.block, d // hcb.WGS)

        def body(j, carry, g, masked: bool):
            t = g * c.n + j - lo
            slot, p_t, ds_t = c.probs(t, masked, j)  # [r, c]
            p16, q_t, do_t = p_t.astype(q_s.dtype), hk.Smem(q_s.at[slot]), hk.Smem(do_s.at[slot])
            h, rows_q = c.dq_rows(j, g)
            gmem = c.outs[0].at[c.b, rows_q, h, dw]

            def stage():
                pl.when(t > 0)(lambda: plgpu.barrier_wait(ds_free))  # both read the last ds^T
                ops.stage(ds_s.at[wg], ds_t)
                plgpu.barrier_arrive(ds_ready)

            own = lambda w: cfg.own(w, j)  # noqa: E731
            if ops.interpret:
                stage()
                plgpu.barrier_wait(ds_ready)
                dq = hcb._dq_half(ops, ds_s, k_s, dw, shape, own)  # [c, D/2]
                plgpu.barrier_arrive(ds_free)
                ops.reduce_add(dq_s.at[wg], dq, gmem)
                dk, dv = carry
                carry = dk + ops._dot(ds_t, q_t), dv + ops._dot(p16, do_t)
                plgpu.barrier_arrive(c.free.at[slot])
                return carry

            def scope(dk_ref, dv_ref):
                dk_ref[...], dv_ref[...] = carry
                if split_dv:
                    ops._issue(dv_ref, p16, do_t)
                stage()
                plgpu.barrier_wait(ds_ready)  # ds^T of both warpgroups written

                def with_dq(dq_ref):  # allocated here: a fresh accumulator starts at zero
                    overlap_dq._issue_dq(ops, ds_s, k_s, dw, dq_ref, own)
                    if not split_dv:
                        ops._issue(dv_ref, p16, do_t)
                    ops._issue(dk_ref, ds_t, q_t)
                    in_flight = 1 if split_dv else 2  # dk (and dv) still running
                    dq = plgpu.wgmma_accumulator_load(dq_ref, wait_n=in_flight)
                    plgpu.barrier_arrive(ds_free)
                    ops.reduce_add(dq_s.at[wg], dq, gmem)

                pl.run_scoped(with_dq, plgpu.WGMMAAccumulatorRef(shape, F32))
                return (plgpu.wgmma_accumulator_load(dk_ref, wait_n=0),
                        plgpu.wgmma_accumulator_load(dv_ref, wait_n=None))

            acc = plgpu.WGMMAAccumulatorRef((cfg.rows, d), F32)
            carry = pl.run_scoped(scope, acc, acc)
            plgpu.barrier_arrive(c.free.at[slot])
            return carry

        c.loop(body)
        pl.when(c.n > 0)(lambda: plgpu.barrier_wait(ds_free))  # observe the last phase
        ops.flush()

    return split_columns


VARIANTS = {"library": LIBRARY, "late": _variant(True, False), "early_wait": _variant(False, True),
            "late_early_wait": _variant(True, True), "dq_first": _dq_first(False),
            "dv_dq_dk": _dq_first(True), "overlap_nested": overlap_dq.VARIANTS["overlap_nested"],
            "fa3_nested": overlap_dq.VARIANTS["fa3_nested"]}


def use(name: str) -> None:
    hcb._split_columns = VARIANTS[name]


kv_init.USE["variant"] = use
kv_init.VARIANTS = VARIANTS

if __name__ == "__main__":
    kv_init.main()
