"""Planned 2026-12-03 (third session) for the next H200 lease: where the fused backward loads its
column vectors (lse2 and delta of the streamed queries).

``hopper_runs_1203c/kv_init.py`` found that loading both before the s^T / dp^T wgmmas are issued
makes the dk/dv kernel 4-8% faster but the fused kernels 4-28% slower (32 more registers live
across the wgmmas next to dk, dv and the dq path). Two cheaper placements, timed against the
library with kv_init's harness (same problems, interleaved rounds, gradients compared):

* ``lse_early``: only lse2 loaded before the issue (16 registers across the wgmmas), so the first
  FFMA after s^T lands does not wait for shared memory; delta as in the library;
* ``delta_mid``: lse2 as in the library, delta loaded as soon as s^T has landed, while dp^T is still
  in flight (no register live across a wgmma issue).

  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1204/kv_cols.py --backwards default \\
      --variants library,lse_early,delta_mid --out $OUT/kv_cols
"""

from __future__ import annotations

import sys

import jax.numpy as jnp
from jax import lax

sys.path.insert(0, "benchmarks/results/hopper_runs_1203c")
import kv_init  # noqa: E402

hk, hbk = kv_init.hk, kv_init.hbk


def _placed(lse_early: bool):
    def kv_probs(cfg, ops, wg, slot, own, smem, masked: bool, columns_first: bool = False):
        del columns_first  # the dk/dv kernel's placement: replaced by this one
        k_s, v_s, q_s, do_s, lse_s, dl_s, qp_s, qs_s = smem
        shape = (cfg.rows, cfg.block)
        wide = lambda x: lax.broadcast_in_dim(x, shape, [1])  # noqa: E731
        lse = ops.cols(lse_s.at[slot]) if lse_early else None  # [c]

        def probs(s_t):  # -> (p^T, delta or None), returned out of the wgmma scope
            delta = None if lse_early else ops.cols(dl_s.at[slot])  # while dp^T is in flight
            lse_c = lse if lse_early else ops.cols(lse_s.at[slot])
            p_t = jnp.exp2(s_t * cfg.qk_scale - wide(lse_c))
            p_t = kv_init._masked(cfg, ops, p_t, own, qp_s, qs_s, slot) if masked else p_t
            return p_t, delta

        (p_t, delta), dp_t = ops.pair(
            (hk.Smem(k_s.at[wg]), hk.Smem(q_s.at[slot], transposed=True)),
            (hk.Smem(v_s.at[wg]), hk.Smem(do_s.at[slot], transposed=True)), shape, probs)
        return p_t, p_t * (dp_t - wide(ops.cols(dl_s.at[slot]) if delta is None else delta))

    return kv_probs


kv_init.VARIANTS.update(lse_early=_placed(lse_early=True), delta_mid=_placed(lse_early=False))

if __name__ == "__main__":
    kv_init.main()
