"""dk/dv's layout in the default backward at head dim 64 (2026-12-04).

The library took ``../hopper_runs_1203g/both.patch`` on 2026-12-04 (``bisect.md``): the key-CTA
kernels write dk, dv head-major [B, K, Sk, D] and two transposes follow. At head dim 128 that ran
4% faster at 128K tokens than the step's [B, Sk, K, D] layout. At head dim 64
(``hopper_cta_dq_bwd.alternating_kernel``) the grid with it ran 0.00-0.03x below the sixth session's
(another lease), and nothing else changed there. Variants, monkeypatched in:

* ``library``: head-major dk, dv plus two transposes;
* ``step``: dk, dv written in the step's layout, no transpose (the library before 2026-12-04).

Run 2026-12-04 at 25e88d4 (128K tokens only; ``kv_layout64.json``, ``bisect.md`` section 6): the
step's layout ran 2% faster with a causal mask and 0.3-0.5% faster without one, so the library went
back to it at head dim 64 (``hopper_fused_bwd.dkv_head_major``). To run this script again, check
out 25e88d4's ``ringattention/``: at later commits *library* is *step* at head dim 64.

Timed with ``../hopper_runs_1203c/kv_init.py``'s harness (bare backward step, rounds in rotated
order, gradients compared with the library's):

  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1204b/kv_layout64.py --backwards default \\
      --problems 32:8:64@16384+65536+131072,32:32:64@65536+131072 --variants library,step \\
      --rounds 5 --out $OUT/kv_layout64
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, "benchmarks/results/hopper_runs_1203c")
import kv_init  # noqa: E402

from ringattention.kernels import hopper_bwd_kernels as hbk  # noqa: E402
from ringattention.kernels import hopper_cta_dq_bwd as hcb  # noqa: E402
from ringattention.kernels import hopper_fused_bwd as hfb  # noqa: E402

LIBRARY = (hcb._run, hfb.KeyCta.loop)
F32 = jnp.float32


def step_loop(self, body) -> None:
    """``KeyCta.loop`` writing dk, dv rows of the step's [B, Sk, K, D] layout."""
    _, dk_ref, dv_ref = self.outs
    d = self.smem[0].shape[2]
    hbk.group_loop(self.cfg, self.ops, body, self.bounds, self.cfg.masked, d,
                   (dk_ref.at[self.b, self.rows, self.kvh], dv_ref.at[self.b, self.rows, self.kvh]))


@functools.partial(jax.jit, static_argnames=("cfg",))
def step_run(lo, mid, hi, q, k, v, do, lse2, delta, *extra, cfg: hbk.BwdConfig):
    """``hopper_cta_dq_bwd._run`` with dk, dv f32 [B, Sk, K, D] out of the kernel."""
    B, sq, H, d = q.shape  # [batch, seq, heads, dim]
    sk, K = k.shape[1], k.shape[2]
    dq_acc = jax.new_ref(jnp.zeros((B, sq, H, d), F32), memory_space=plgpu.GMEM)
    out = jax.ShapeDtypeStruct((B, sk, K, d), F32)  # [batch, keys, kv heads, dim]
    kernel = hcb.alternating_kernel if d == 64 else hcb.cta_dq_kernel
    dk, dv = hfb._launch(functools.partial(kernel, cfg=cfg), (out, out),
                         hcb._scratch(d, q.dtype, cfg.stages, cfg.positions, cfg.segments),
                         grid=(K, sk // hcb.CTA, B), interpret=cfg.interpret)(
        lo, mid, hi, q, k, v, do, lse2, delta, *extra, dq_acc)
    return dq_acc[...] * (cfg.scale if d != 64 else 1.0), dk, dv


VARIANTS = {"library": LIBRARY, "step": (step_run, step_loop)}


def use(name: str) -> None:
    hcb._run, hfb.KeyCta.loop = VARIANTS[name]


kv_init.USE["variant"] = use
kv_init.VARIANTS = VARIANTS

if __name__ == "__main__":
    kv_init.main()
