"""The fused (default) backward's dk, dv wgmmas with their A operand from shared memory instead of
registers (2026-12-04, second session, for the next lease). Run in the third session
(``../hopper_runs_1204d/runs.md``): ``dk_smem`` 0.911-1.027x of the library, ``dkv_smem``
0.686-0.947x, more spills in the causal kernel and no C7519 note in either; not adopted.

``hbk.kv_update`` issues ``dv += p^T do`` and ``dk += ds^T q`` with p^T and ds^T (16-bit) in
registers. In ``hopper_cta_dq_bwd`` ds^T is already in shared memory by then (it is staged for dq,
which reads it transposed), and ptxas must keep a register operand untouched until its wgmma has
landed (``overlap_dq.py``'s variants, which issued more wgmmas around such operands, got
"warpgroup.arrive is injected ... to allow use of registers in GMMA", C7519, and ran 2-9% slower).
FlashAttention-3 (Shah et al. 2024) chooses per head dim whether dK/dV's wgmmas read P and dS from
registers or from shared memory. Variants of ``hopper_cta_dq_bwd._kv_update`` (both loops, head
dims 128 and 64, call it right after staging ds^T), monkeypatched in:

* ``library``: as shipped;
* ``dk_smem``: dk's wgmma reads ds^T from the buffer staged for dq (no new stores);
* ``dkv_smem``: that, and p^T staged to a new [2, 64, 64] 16-bit buffer (8 KB per warpgroup) from
  which dv's wgmma reads it.

Both keep the library's order of sums, so the interpret-mode run (CPU) gives bitwise the library's
gradients. Timed with ``../hopper_runs_1203c/kv_init.py``'s harness (bare backward step, rounds in
rotated order, gradients compared with the library's):

  PYTHONPATH=. python3 benchmarks/results/hopper_runs_1204c/smem_ds.py --backwards default \\
      --problems 32:32:128@16384+131072,32:8:128@131072,32:8:64@16384+131072 \\
      --variants library,dk_smem,dkv_smem --rounds 3 --out $OUT/smem_ds
"""

from __future__ import annotations

import sys

from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, "benchmarks/results/hopper_runs_1203c")
import kv_init  # noqa: E402

from ringattention.kernels import hopper_cta_dq_bwd as hcb  # noqa: E402
from ringattention.kernels import hopper_kernels as hk  # noqa: E402

LIBRARY = (hcb._kv_update, hcb._scratch)
TILES = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))  # 16-bit, 128 bytes


def _scratch_pt(d, dtype, stages, positions, segments):
    """The library's buffers, then p^T [r keys, c queries] per warpgroup."""
    return [*LIBRARY[1](d, dtype, stages, positions, segments),
            plgpu.SMEM((hcb.WGS, hcb.ROWS, hcb.ROWS), dtype, transforms=TILES)]


def _kv_update(c, carry, p_t, ds_t, ds_smem, slot, stage_p: bool):
    """dk += ds^T q with ds^T read from ``ds_smem``; dv += p^T do with p^T from registers, or
    (``stage_p``) staged to the appended buffer first."""
    del ds_t
    ops, q_s, do_s = c.ops, c.smem[2], c.smem[3]
    dv_a = p_t.astype(q_s.dtype)
    if stage_p:
        ops.stage(c.scratch[-1].at[c.wg], dv_a)
        dv_a = hk.Smem(c.scratch[-1].at[c.wg])
    dk, dv = carry
    dv, dk = ops.mma((dv, dv_a, hk.Smem(do_s.at[slot])),
                     (dk, hk.Smem(ds_smem), hk.Smem(q_s.at[slot])))
    return dk, dv


def use(name: str) -> None:
    if name == "library":
        hcb._kv_update, hcb._scratch = LIBRARY
        return
    stage_p = {"dk_smem": False, "dkv_smem": True}[name]
    hcb._kv_update = lambda *a: _kv_update(*a, stage_p=stage_p)
    hcb._scratch = _scratch_pt if stage_p else LIBRARY[1]


kv_init.USE["variant"] = use

if __name__ == "__main__":
    kv_init.main()
