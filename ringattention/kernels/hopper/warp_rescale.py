"""The online softmax's rescale of the output accumulator, skipped where it changes nothing.

In the forward (FlashAttention-3, Shah et al. 2024, for one step of Ring Attention, Liu, Zaharia &
Abbeel 2023) each key block multiplies the float32 accumulator o [64, Dv] by
``alpha = 2^(m_old - m_new)`` per row: as many multiplies per block as logits at head dim 128.
Once a row's maximum has settled (after a few blocks on random data; at once where an early
token dominates, as attention sinks do) alpha is exactly 1 and the multiply is ``o * 1 = o``.
FlashAttention-4 skips the rescale unless the maximum grew by more than a threshold, which
changes the result; here a warp skips it only when alpha is exactly 1 in all 16 of its rows (one
vote per warp and block, a uniform branch around the multiplies), so the output is bitwise the
one of the unconditional rescale. Measured: docs/kernels.md.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, llvm, scf, vector
from jax.experimental.pallas import mosaic_gpu as plgpu

# vote.sync.any over the warp of a 32-bit flag (an asm block: a predicate cannot be an operand)
_VOTE_ANY = (
    "{ .reg .pred p; setp.ne.u32 p, $1, 0; vote.sync.any.pred p, p, 0xffffffff; selp.u32 $0, 1, 0, p; }"
)


def rescale(acc, alpha, interpret: bool):
    """acc [bq, Dv] float32 times alpha [bq] per row (``plgpu.Layout.WGMMA`` and its row vector);
    on the device the multiplies of a warp all of whose rows have alpha == 1 are skipped."""
    alpha_b = lax.broadcast_in_dim(alpha, acc.shape, [0])  # [bq, Dv]
    if interpret:
        return acc * alpha_b
    layout = plgpu.Layout.WGMMA

    @plgpu.inline_mgpu(
        arg_types=(layout, layout, layout.reduce(1)),
        return_type=plgpu.ShapeDtypeStruct(acc.shape, jnp.float32, layout),
    )
    def skipped_where_one(ctx, acc, alpha_b, alpha):
        del ctx
        flat = list(acc.registers.flat)
        branch = scf.IfOp(_any_in_warp(_changed(alpha)), [r.type for r in flat], has_else=True)
        with ir.InsertionPoint(branch.then_block):
            scf.yield_(list((acc * alpha_b).registers.flat))
        with ir.InsertionPoint(branch.else_block):
            scf.yield_(flat)
        registers = np.array(list(branch.results), dtype=object).reshape(acc.registers.shape)
        return type(acc)(_registers=registers, _layout=acc.layout, _is_signed=None)

    return skipped_where_one(acc, alpha_b, alpha)


def _changed(alpha):
    """i1: whether any of this thread's rows has alpha != 1."""
    one = arith.constant(ir.F32Type.get(), 1.0)
    out = arith.constant(ir.IntegerType.get_signless(1), 0)
    for reg in alpha.registers.flat:
        is_vector = isinstance(reg.type, ir.VectorType)
        for k in range(ir.VectorType(reg.type).shape[0] if is_vector else 1):
            pos = ir.DenseI64ArrayAttr.get([k])
            x = vector.extract(reg, dynamic_position=[], static_position=pos) if is_vector else reg
            out = arith.ori(out, arith.cmpf(arith.CmpFPredicate.UNE, x, one))
    return out


def _any_in_warp(flag):
    """i1 -> i1: whether ``flag`` is set in any lane of the warp (uniform across the warp)."""
    i32 = ir.IntegerType.get_signless(32)
    voted = llvm.inline_asm(i32, [arith.extui(i32, flag)], _VOTE_ANY, "=r,r")
    return arith.cmpi(arith.CmpIPredicate.ne, voted, arith.constant(i32, 0))
