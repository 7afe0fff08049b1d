"""dq one block pair late in the head-dim-128 fused backward (2026-12-03, fourth session).

In ``hopper_cta_dq_bwd._split_columns`` (the default backward at head dim 128) the two compute
warpgroups of a key CTA meet at a barrier in every block pair: warpgroup w computes the columns
[w D/2, (w + 1) D/2) of ``dq = ds_0 @ k_0 + ds_1 @ k_1`` as soon as both have written ds^T of the
pair. That holds them in lockstep: both run the softmax (tensor cores idle) and then both issue
their dk/dv wgmmas (queued behind each other) at the same time. The head-dim-64 kernel, whose
warpgroups take turns and may drift apart by a pair, runs 1.00-1.04x cuDNN; head dim 128 0.94-1.00x.

``lag``, below: ds^T double-buffered by the pair's parity, and pair t's dq computed after pair
t + 1's dk/dv update (the last pair's after the loop). A warpgroup may then run up to one pair
ahead of the other, so one's softmax can overlap the other's wgmmas, as the forward's ping-pong
arranges on purpose. It costs 16 KB more shared memory (192 of 227 KB at 2 stages). The arithmetic
is the library's: dk, dv bit for bit, dq up to the order of the TMA reduce-adds. Timed against the
library with ``hopper_runs_1203c/kv_init.py``'s harness (bare backward step, interleaved rounds,
gradients compared with the library's):

  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1204/lag_dq.py --backwards default \\
      --variants library,lag --out $OUT/lag_dq

How it ran (``lag_dq.json``, ``lease.sh ab``): the same kernel as a library change,
``lag_dq.patch`` applied to the tree, timed against the library's own kernel patched back in as
"lockstep"; so in that file "library" is the lag and "lockstep" the library. The lag was 3-10%
slower (section "2026-12-03 (fourth session)" of pallas_hopper_h200.md) and is not in the library.
"""

from __future__ import annotations

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

F32 = jnp.float32
WGS, ROWS = hcb.WGS, hcb.ROWS
LIBRARY = {"cta_dq_kernel": hcb.cta_dq_kernel, "_scratch": hcb._scratch}


def _lagged(c: hfb.KeyCta):
    """``_split_columns`` with pair t's dq computed after pair t + 1's dk/dv update."""
    cfg, ops, wg = c.cfg, c.ops, c.wg
    k_s, _, q_s, do_s = c.smem[:4]
    ds_s, dq_s, ready, done = c.scratch  # ds^T [2 parities, WGS, r, c]; barriers per parity
    lo, d = c.bounds[0], k_s.shape[2]
    dw = pl.ds(wg * (d // WGS), d // WGS)
    total = c.n * cfg.groups

    def add_dq(t):  # columns dw of pair t's dq from both warpgroups' ds^T
        par = lax.rem(t, jnp.int32(2))
        plgpu.barrier_wait(ready.at[par])  # ds^T of both written
        dq = hcb._dq_half(ops, ds_s.at[par], k_s, dw, (cfg.block, d // WGS))  # [c, D/2]
        plgpu.barrier_arrive(done.at[par])
        g = lax.div(t, c.n)  # c.n > 0 whenever a pair exists
        h, rows_q = c.dq_rows(lo + t - g * c.n, g)
        ops.reduce_add(dq_s.at[wg], dq, c.outs[0].at[c.b, h, rows_q, dw])

    def pair(j, carry, g, masked: bool):
        t = g * c.n + j - lo
        par = lax.rem(t, jnp.int32(2))
        slot, p_t, ds_t = c.probs(t, masked)  # [r, c]
        pl.when(t >= 2)(lambda: plgpu.barrier_wait(done.at[par]))  # both read pair t - 2's
        ops.stage(ds_s.at[par, wg], ds_t)
        plgpu.barrier_arrive(ready.at[par])
        carry = hbk.kv_update(ops, carry, p_t, ds_t, q_s.at[slot], do_s.at[slot])
        plgpu.barrier_arrive(c.free.at[slot])
        pl.when(t >= 1)(lambda: add_dq(t - 1))
        return carry

    c.loop(pair)
    pl.when(total > 0)(lambda: add_dq(total - 1))
    for par in range(2):  # the last phase of each parity's done barrier
        pl.when(total > par)(lambda par=par: plgpu.barrier_wait(done.at[par]))
    ops.flush()


def lagged_kernel(*refs, cfg):
    hfb.key_cta_kernel(refs, cfg, _lagged)


def lagged_scratch(d: int, dtype, stages: int, positions: bool, segments: bool):
    """The library's buffers with ds^T per parity and the ready / done barriers per parity."""
    if d == 64:  # the alternating kernel is left as it is
        return LIBRARY["_scratch"](d, dtype, stages, positions, segments)
    *common, ds_s, dq_s, _, _ = LIBRARY["_scratch"](d, dtype, stages, positions, segments)
    ds2 = plgpu.SMEM((2, *ds_s.shape), ds_s.dtype, transforms=ds_s.transforms)
    return [*common, ds2, dq_s, plgpu.Barrier(num_arrivals=WGS, num_barriers=2),
            plgpu.Barrier(num_arrivals=WGS, num_barriers=2)]


def use(name: str) -> None:
    """Puts variant ``name`` in place: "lag" (this file's kernel) or one of kv_init's."""
    lag = name == "lag"
    hcb.cta_dq_kernel = lagged_kernel if lag else LIBRARY["cta_dq_kernel"]
    hcb._scratch = lagged_scratch if lag else LIBRARY["_scratch"]
    kv_init.use_kv_probs("library" if lag else name)


kv_init.VARIANTS["lag"] = kv_init.LIBRARY
kv_init.USE["variant"] = use

if __name__ == "__main__":
    kv_init.main()
