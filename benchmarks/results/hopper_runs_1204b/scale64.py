"""Head dim 64's dq tiles: scaled before each reduce-add or once after the kernel (2026-12-04, for
the next lease).

At head dim 128 the bisect (``bisect.md``) found the softmax scale applied to every dq tile before
its TMA reduce-add cost 6% at 128K tokens without a mask (0.92x -> 0.98x cuDNN when undone); the
library now adds head dim 128's tiles unscaled and scales dq once after the kernel. Head dim 64's
``hopper_cta_dq_bwd.alternating_kernel`` still scales in the loop: it was not part of the bisect.
Variants, monkeypatched in:

* ``library``: ``_take_turns`` multiplies each [64, 64] float32 tile by the scale before adding it;
* ``after``: the same kernel with the tile added as computed, dq scaled once after the kernel.

Timed with ``../hopper_runs_1203c/kv_init.py``'s harness (bare backward step, rounds in rotated
order, gradients compared with the library's):

  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1204b/scale64.py --backwards default \\
      --problems 32:8:64@16384+65536+131072,32:32:64@65536+131072 --variants library,after \\
      --rounds 5 --out $OUT/scale64
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, "benchmarks/results/hopper_runs_1203c")
import kv_init  # noqa: E402

from ringattention.kernels import hopper_bwd_kernels as hbk  # noqa: E402
from ringattention.kernels import hopper_cta_dq_bwd as hcb  # noqa: E402
from ringattention.kernels import hopper_fused_bwd as hfb  # noqa: E402

LIBRARY = (hcb._run, hcb._take_turns)
F32 = jnp.float32


def take_turns_unscaled(c: hfb.KeyCta):
    """``hopper_cta_dq_bwd._take_turns`` (at 25e88d4) with the dq tile added unscaled."""
    cfg, ops, wg = c.cfg, c.ops, c.wg
    k_s, _, q_s, do_s = c.smem[:4]
    ds_s, dq_s, ready, done = c.scratch
    lo, d = c.bounds[0], k_s.shape[2]

    def body(j, carry, g, masked: bool):
        t = g * c.n + j - lo
        par = lax.rem(t, jnp.int32(2))
        slot, p_t, ds_t = c.probs(t, masked)  # [r, c]
        pl.when(t >= 2)(lambda: plgpu.barrier_wait(done.at[par]))
        ops.stage(ds_s.at[par, wg], ds_t)
        plgpu.barrier_arrive(ready.at[par])
        carry = hbk.kv_update(ops, carry, p_t, ds_t, q_s.at[slot], do_s.at[slot])
        plgpu.barrier_arrive(c.free.at[slot])

        @pl.when(wg == par)
        def _():
            plgpu.barrier_wait(ready.at[par])
            dq = hcb._dq_half(ops, ds_s.at[par], k_s, pl.ds(0, d), (cfg.block, d))  # [c, D]
            plgpu.barrier_arrive(done.at[par])
            h, rows_q = c.dq_rows(j, g)
            ops.reduce_add(dq_s.at[wg], dq, c.outs[0].at[c.b, rows_q, h])  # no multiply

        return carry

    c.loop(body)
    for par in range(2):
        pl.when(c.n * cfg.groups > par)(lambda par=par: plgpu.barrier_wait(done.at[par]))
    ops.flush()


@functools.partial(jax.jit, static_argnames=("cfg",))
def run_scaled_after(lo, mid, hi, q, k, v, do, lse2, delta, *extra, cfg: hbk.BwdConfig):
    """``hopper_cta_dq_bwd._run`` with dq scaled after the kernel at every head dim."""
    B, sq, H, d = q.shape  # [batch, seq, heads, dim]
    sk, K = k.shape[1], k.shape[2]
    dq_acc = jax.new_ref(jnp.zeros((B, sq, H, d), F32), memory_space=plgpu.GMEM)
    out = hfb.dkv_out(B, sk, K, d)
    kernel = hcb.alternating_kernel if d == 64 else hcb.cta_dq_kernel
    dk, dv = hfb._launch(functools.partial(kernel, cfg=cfg), (out, out),
                         hcb._scratch(d, q.dtype, cfg.stages, cfg.positions, cfg.segments),
                         grid=(K, sk // hcb.CTA, B), interpret=cfg.interpret)(
        lo, mid, hi, q, k, v, do, lse2, delta, *extra, dq_acc)
    return (dq_acc[...] * cfg.scale, *hfb.dkv_to_step(dk, dv))


VARIANTS = {"library": LIBRARY, "after": (run_scaled_after, take_turns_unscaled)}


def use(name: str) -> None:
    hcb._run, hcb._take_turns = VARIANTS[name]


kv_init.USE["variant"] = use
kv_init.VARIANTS = VARIANTS

if __name__ == "__main__":
    kv_init.main()
