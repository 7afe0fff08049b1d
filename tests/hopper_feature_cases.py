"""What the tests of the optional step features in the Hopper (Mosaic GPU) forward share: ``Case``
(a step with soft-capping, a prefix, bidirectional segments or v's own head dim), its check in
interpret mode against the float32 step reference ``pallas_gpu.reference_forward_step``, and the
forward's kernels lowered for CUDA with their operations counted.

The tests: test_hopper_features_fwd.py (interpret mode), test_hopper_features_fwd_lowering.py (pure
JAX) and test_hopper_out_dtype.py.
"""

import collections
import dataclasses
import functools
import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from hopper_cases import LSE_ATOL
from jax.experimental.pallas import mosaic_gpu as plgpu
from ringcheck import BF16_RTOL, mosaic_modules, rel_err

from ringattention.kernels.hopper import pallas_hopper as ph
from ringattention.kernels.triton import pallas_gpu as pg


def _segments(rng, batch: int, n: int, bidirectional: bool):
    """Sorted ids 0..3 per row; ``bidirectional``: odd ids negative (-1, -3: bidirectional)."""
    seg = np.sort(rng.integers(0, 4, (batch, n)), axis=1)
    return np.where(seg % 2 == 1, -seg, seg) if bidirectional else seg


@dataclasses.dataclass(frozen=True)
class Case:
    dim: int
    dv: int | None = None  # v's head dim (None: dim)
    causal: bool = True
    softcap: float | None = None
    prefix: tuple[int, ...] | None = None  # per batch row
    bidirectional: bool = False
    segments: bool = False
    window: int | None = None
    heads: int = 2
    kv_heads: int = 1
    sq: int = 72
    sk: int = 200
    where: str = "overlap"  # the queries' positions: after, overlapping or before the keys'
    batch: int = 1
    unseen: bool = False  # some queries in a segment no key has (they see nothing)
    logit_scale: float = 1.0
    bs: ph.BlockSizes | None = None

    def inputs(self, seed: int):
        rng = np.random.default_rng(seed)
        f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.bfloat16)  # noqa: E731
        dv = self.dv or self.dim
        q = f(self.batch, self.sq, self.heads, self.dim)
        if self.logit_scale != 1.0:
            q = (q.astype(jnp.float32) * self.logit_scale).astype(jnp.bfloat16)
        k = f(self.batch, self.sk, self.kv_heads, self.dim)
        v = f(self.batch, self.sk, self.kv_heads, dv)
        offset = {"after": self.sk, "overlap": self.sk // 2, "before": -self.sq}[self.where]
        q_pos = jnp.arange(self.sq, dtype=jnp.int32) + offset
        k_pos = jnp.arange(self.sk, dtype=jnp.int32)
        q_seg = k_seg = None
        if self.segments:  # documents of the global sequence, as the ring deals them
            first = min(offset, 0)
            seg = _segments(rng, self.batch, max(offset + self.sq, self.sk) - first, self.bidirectional)
            q_seg, k_seg = seg[:, np.asarray(q_pos) - first], seg[:, np.asarray(k_pos) - first]
            if self.unseen:  # rows 5..12 (causal and bidirectional) in ids no key has
                q_seg[:, 5:9], q_seg[:, 9:13] = 9, -9
            q_seg, k_seg = jnp.asarray(q_seg, jnp.int32), jnp.asarray(k_seg, jnp.int32)
        return q, k, v, q_pos, k_pos, q_seg, k_seg

    def keywords(self) -> dict:
        kw = dict(
            causal=self.causal,
            softmax_scale=self.dim**-0.5,
            window=self.window,
            softcap=self.softcap,
            bidirectional=self.bidirectional,
        )
        if self.prefix is not None:
            kw["prefix"] = jnp.asarray(self.prefix, jnp.int32)
        return kw


def _check_forward(case: Case, seed: int = 0, lse_atol: float = LSE_ATOL):
    """forward_step in interpret mode against the float32 reference; returns the reference lse."""
    q, k, v, q_pos, k_pos, q_seg, k_seg = case.inputs(seed)
    kw = case.keywords()
    o, lse = ph.forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, block_sizes=case.bs, interpret=True, **kw)
    ro, rlse = pg.reference_forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, **kw)
    assert o.dtype == lse.dtype == jnp.float32
    assert o.shape == ro.shape == (*q.shape[:3], v.shape[3]) and lse.shape == rlse.shape
    o, lse, rlse = np.asarray(o), np.asarray(lse), np.asarray(rlse)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    unseen = np.isneginf(rlse)  # [B, H, Sq]
    np.testing.assert_array_equal(np.isneginf(lse), unseen)
    assert np.all(o.transpose(0, 2, 1, 3)[unseen] == 0.0)  # rows that see nothing: exactly 0
    assert np.abs(lse[~unseen] - rlse[~unseen]).max() <= lse_atol
    assert rel_err(o, ro) <= BF16_RTOL
    return rlse


PINGPONG3 = ph.BlockSizes(schedule="pingpong3")


def _mosaic_kernels(fn, *args, semantics: str = "default"):
    """[(operation counts, number of custom-call operands)] of the Mosaic GPU kernels of ``fn``
    lowered for CUDA; the counts include each inline assembly's instruction as ``asm:<name>``."""
    params = plgpu.CompilerParams
    if semantics == "warpgroup":
        params = functools.partial(plgpu.CompilerParams, lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
    jax.clear_caches()  # the kernels' jitted wrappers would reuse the other semantics' lowering
    with mosaic_modules() as texts, mock.patch.object(plgpu, "CompilerParams", params):
        hlo = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    calls = re.findall(r"stablehlo.custom_call @mosaic_gpu\w*\(([^)]*)\)", hlo)
    assert len(texts) == len(calls) >= 1, (len(texts), len(calls))
    kernels = []
    for text, call in zip(texts, calls, strict=True):
        ops = collections.Counter(re.findall(r"= ([a-z_]+\.[a-z_.]+)", text))
        ops.update(
            "asm:" + m.split()[0]
            for m in re.findall(r'llvm.inline_asm (?:has_side_effects )?"([^"]*)"', text)
        )
        kernels.append((ops, len(call.split(","))))
    return kernels


def _lower(*, dim=128, dv=None, causal=True, segments=False, prefix=False, semantics="default", **kw):
    q = jax.ShapeDtypeStruct((2, 512, 4, dim), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 512, 2, dim), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((2, 512, 2, dv or dim), jnp.bfloat16)
    pos = jax.ShapeDtypeStruct((512,), jnp.int32)
    seg = jax.ShapeDtypeStruct((2, 512), jnp.int32) if segments else None
    pf = jax.ShapeDtypeStruct((2,), jnp.int32) if prefix else None

    def fwd(q, k, v, p, s, pf):
        return ph.forward_step(q, k, v, p, p, s, s, prefix=pf, causal=causal, softmax_scale=dim**-0.5, **kw)

    [kernel] = _mosaic_kernels(fwd, q, k, v, pos, seg, pf, semantics=semantics)
    return kernel
