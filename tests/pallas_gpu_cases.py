"""What the tests of the Pallas GPU (Triton) ring step share: the block sizes, the tolerances, a step
with the optional features (``FeatureCase``), its inputs, and the check of a step's o, lse and
gradients against another's.

The tests: test_pallas_gpu_step.py (kernel-level, interpret mode), test_pallas_gpu_ring.py (the ring
matrix, interpret mode), test_pallas_gpu_features.py (the optional step features) and
test_pallas_gpu_device.py (on a CUDA device only).
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
from ringcheck import BF16_RTOL, F32_RTOL, rel_err

from ringattention.kernels.triton import pallas_gpu as pg

# Two blocks per shard of 32: hidden, partial and full block pairs all occur within one step.
BS = pg.BlockSizes(
    block_q=16,
    block_k=16,
    fwd_warps=4,
    fwd_stages=2,
    block_q_dq=16,
    block_k_dq=16,
    block_q_dkv=16,
    block_k_dkv=16,
    bwd_warps=4,
    bwd_stages=2,
)
# Unequal blocks per kernel (and a tail block) for the kernel-level tests.
BS_MIXED = pg.BlockSizes(block_q=32, block_k=16, block_q_dq=16, block_k_dq=32, block_q_dkv=32, block_k_dkv=16)
RTOL = {"float32": F32_RTOL, "bfloat16": BF16_RTOL}
LSE_RTOL = F32_RTOL  # log-sum-exps are float32 sums of float32 logits, for bf16 inputs too


@dataclasses.dataclass(frozen=True)
class FeatureCase:
    """One step with optional features; consecutive positions ``offset + i`` for queries, ``i``
    for keys (times ``stride``), batch 2, 4 query heads, documents derived from positions."""

    dtype: str = "float32"
    causal: bool = True
    segments: bool = False
    kv_heads: int = 2
    sq: int = 48
    sk: int = 48
    dim: int = 32
    dim_v: int | None = None  # v's own head dim
    softcap: float | None = None
    prefix: tuple[int, int] | None = None  # per batch row, in positions
    bidirectional: bool = False  # odd documents get negative ids
    window: int | None = None
    offset: int = 0
    stride: int = 1

    def __str__(self):
        default = FeatureCase()
        return (
            "-".join(
                f"{f.name}={getattr(self, f.name)}"
                for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(default, f.name)
            )
            or "default"
        )

    def keywords(self) -> dict:
        kw = dict(
            causal=self.causal,
            softmax_scale=self.dim**-0.5,
            window=self.window,
            softcap=self.softcap,
            bidirectional=self.bidirectional,
        )
        kw["prefix"] = None if self.prefix is None else jnp.asarray(self.prefix, jnp.int32)
        return kw


def _feature_inputs(case: FeatureCase):
    rng = np.random.default_rng(case.sq * case.sk + case.dim + (case.dim_v or 0))
    f = lambda *s: jnp.asarray(rng.standard_normal(s), case.dtype)  # noqa: E731
    dv = case.dim_v or case.dim
    q, do = f(2, case.sq, 4, case.dim), f(2, case.sq, 4, dv)
    k, v = f(2, case.sk, case.kv_heads, case.dim), f(2, case.sk, case.kv_heads, dv)
    q_pos = (np.arange(case.sq) + case.offset) * case.stride
    k_pos = np.arange(case.sk) * case.stride
    q_seg = k_seg = None
    if case.segments:  # documents: 3 random boundaries per row over all positions
        top = max(q_pos[-1], k_pos[-1]) + 1
        bounds = np.sort(rng.integers(1, top, (2, 3)), axis=1)
        doc = lambda pos: np.stack([np.searchsorted(b, pos, side="right") for b in bounds])  # noqa: E731
        q_seg, k_seg = doc(q_pos), doc(k_pos)  # [2, S]
        if case.bidirectional:
            q_seg, k_seg = (np.where(s % 2 == 1, -s, s) for s in (q_seg, k_seg))
        q_seg, k_seg = jnp.asarray(q_seg, jnp.int32), jnp.asarray(k_seg, jnp.int32)
    q_pos, k_pos = jnp.asarray(q_pos, jnp.int32), jnp.asarray(k_pos, jnp.int32)
    return q, k, v, do, q_pos, k_pos, q_seg, k_seg


def _assert_close(got, want, rtol, what):
    """o/lse/dq/dk/dv of ``got`` against ``want``: the same rows see nothing (lse -inf), finite
    lse within LSE_RTOL, the rest within ``rtol``."""
    lse, rlse = np.asarray(got[1]), np.asarray(want[1])
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(rlse), what)
    finite = np.isfinite(rlse)
    assert rel_err(lse[finite], rlse[finite]) <= LSE_RTOL, f"{what}: lse"
    for name, g, w in zip(("o", "dq", "dk", "dv"), got[:1] + got[2:], want[:1] + want[2:], strict=True):
        assert g.shape == w.shape, f"{what}: {name} {g.shape} != {w.shape}"
        assert rel_err(g, w) <= rtol, f"{what}: {name} {rel_err(g, w):.2e} > {rtol}"
