"""The Pallas Mosaic GPU (Hopper) kernels lowered for CUDA: pure JAX, no GPU and no interpreter, so
these always run.

``test_kernels_lower_for_cuda`` lowers every Mosaic GPU kernel for CUDA (wgmma, layouts, TMA,
``setmaxnreg``) under both Mosaic GPU lowering semantics, so lowering errors show up here rather than
on the device; ``test_steps_write_their_outputs_in_place`` counts the transposes around the kernels.
"""

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from ringattention.kernels.hopper import pallas_hopper as ph

LOWER_CASES = [  # (backward, head dim, causal, segments, kv_heads, extra BlockSizes fields[, window])
    ("mosaic", 64, True, True, 2, dict(bwd_block_k=128, registers=232)),  # deterministic=True's at 64
    ("mosaic", 128, False, False, 4, dict(bwd_block_k=128, registers=240)),
    ("fused", 128, True, False, 2, dict(registers=240)),  # cta_dq_bwd
    ("fused", 80, False, True, 4, {}),
    ("mosaic", 256, True, True, 2, dict(block_k=64, registers=240)),  # split_bwd
    ("mosaic", 256, False, True, 1, dict(block_k=64, registers=240)),  # its dq + dk/dv kernels
    ("mosaic", 192, False, False, 4, dict(block_k=64)),  # padded to 256 in the backward
    ("fused", 128, True, True, 2, dict(bwd_stages=3)),
    ("mosaic", 64, False, True, 2, {}, 100),
    ("fused", 128, True, False, 2, dict(registers=240), 200),
    ("mosaic", 256, True, True, 2, dict(block_k=64, registers=240), 200),
    ("mosaic", 256, False, False, 1, dict(block_k=64, registers=240), 100),
    ("fused", 128, False, True, 2, dict(bwd_stages=3), 150),
    ("fused", 64, True, True, 2, {}),  # cta_dq_bwd.alternating_kernel
    ("fused", 40, False, False, 4, dict(bwd_stages=4), 100),
    ("fused", 128, False, False, 2, {}),  # no mask, GQA: the flat group loop
    ("fused", 64, False, False, 1, {}),
    ("mosaic", 256, False, False, 2, dict(block_k=64, registers=240)),  # the default at 256
    ("fused", 128, False, False, 2, dict(registers=240, schedule="overlap")),  # the
    # default at 128 without a mask
    ("fused", 64, True, True, 2, dict(schedule="overlap"), 100),  # overlap at head dim 64, window
    (
        "fused",
        64,
        True,
        True,
        2,
        dict(block_k=128, schedule="pingpong3", bwd_stages=3, registers=240),
    ),  # the default at 64 with a causal mask
    ("fused", 64, False, False, 2, dict(block_k=256, bwd_stages=3), 100),
    ("fused", 128, False, False, 2, dict(split_group=True)),  # a CTA per query head
]


@pytest.mark.parametrize("semantics", ["default", "warpgroup"])
@pytest.mark.parametrize(
    "case", LOWER_CASES, ids=lambda c: f"{c[0]}-d{c[1]}-{c[2]}-{c[3]}" + "".join(f"-w{w}" for w in c[6:])
)
def test_kernels_lower_for_cuda(case, semantics, monkeypatch):
    """Every Mosaic GPU kernel goes through Mosaic GPU's lowering for CUDA (no GPU needed): one
    custom call for the forward, two for the two-kernel backward, one for the fused one. Under
    both lowering semantics: jax 0.10 defaults to lane semantics, jax >= 0.11 (the GPU machine's)
    to warpgroup semantics, which rejects some kernels that lane semantics accepts."""
    jax.clear_caches()  # the kernels' jitted wrappers would reuse the other semantics' lowering
    if semantics == "warpgroup":
        monkeypatch.setattr(
            plgpu,
            "CompilerParams",
            functools.partial(plgpu.CompilerParams, lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        )
    backward, dim, causal, segments, kv_heads, fields, *window = case
    bs = ph.BlockSizes(backward=backward, **fields)
    q = jax.ShapeDtypeStruct((1, 384, 4, dim), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((1, 384, kv_heads, dim), jnp.bfloat16)
    pos = jax.ShapeDtypeStruct((384,), jnp.int32)
    seg = jax.ShapeDtypeStruct((1, 384), jnp.int32) if segments else None
    lse = jax.ShapeDtypeStruct((1, 4, 384), jnp.float32)
    kw = dict(causal=causal, softmax_scale=dim**-0.5, block_sizes=bs)
    if window:
        kw["window"] = window[0]

    def fwd(q, k, v, p, s):
        return ph.forward_step(q, k, v, p, p, s, s, **kw)

    def bwd(q, k, v, do, lse, delta, p, s):
        return ph.backward_step(q, k, v, do, lse, delta, p, p, s, s, **kw)

    def mosaic_calls(fn, *args):
        text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        return text.count("stablehlo.custom_call @mosaic_gpu")

    assert mosaic_calls(fwd, q, k, k, pos, seg) == 1
    assert mosaic_calls(bwd, q, k, k, q, lse, lse, pos, seg) == (2 if backward == "mosaic" else 1)


def _float_transposes(fn, *args) -> list[str]:
    """The float32/bf16 transposes of ``fn`` lowered for CUDA (the int32 block table of the key
    CTAs is transposed too, [B, nq, nk] -> [B, nk, nq], and is not counted)."""
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "stablehlo.custom_call @mosaic_gpu" in text
    return [
        line
        for line in text.splitlines()
        if "stablehlo.transpose" in line and ("xf32>" in line or "xbf16>" in line)
    ]


def _step_shapes(dim: int):
    """q, k (also v), positions and lse of a 512-token step with 4:2 heads, as ShapeDtypeStructs."""
    return (
        jax.ShapeDtypeStruct((1, 512, 4, dim), jnp.bfloat16),
        jax.ShapeDtypeStruct((1, 512, 2, dim), jnp.bfloat16),
        jax.ShapeDtypeStruct((512,), jnp.int32),
        jax.ShapeDtypeStruct((1, 4, 512), jnp.float32),
    )


@pytest.mark.parametrize(
    "dim,causal,deterministic",
    [(128, True, False), (128, False, False), (64, True, False), (128, True, True)],
)
def test_steps_write_their_outputs_in_place(dim, causal, deterministic):
    """The Mosaic kernels write o and dq in the step's [B, S, heads, D] layout, and the deterministic
    backward and head dim 64's default dk and dv too, so those steps, lowered for CUDA, hold no
    transpose: on an H200 the transposes took about 0.5 ms of a 15 ms step at 16K tokens (2026-12-03,
    docs/kernels.md). At head dim 128 the default backward's
    kernel writes dk, dv head-major and holds exactly their two transposes, [B, K, Sk, D] ->
    [B, Sk, K, D]: the step's layout ran 0.9-6% slower at 128K tokens (docs/kernels.md;
    ``fused_bwd.dkv_head_major``)."""
    bs = (
        ph.deterministic_block_sizes(None, dim, causal)
        if deterministic
        else ph.default_block_sizes(dim, causal)
    )
    q, k, pos, lse = _step_shapes(dim)
    kw = dict(causal=causal, softmax_scale=dim**-0.5, block_sizes=bs)

    def fwd(q, k, v, p):
        return ph.forward_step(q, k, v, p, p, None, None, **kw)

    def bwd(q, k, v, do, lse, delta, p):
        return ph.backward_step(q, k, v, do, lse, delta, p, p, None, None, **kw)

    assert _float_transposes(fwd, q, k, k, pos) == []
    transposes = _float_transposes(bwd, q, k, k, q, lse, lse, pos)
    if deterministic or dim == 64:
        assert transposes == []
    else:  # dk and dv, [1, 2, 512, D] -> [1, 512, 2, D]
        assert len(transposes) == 2, transposes
        assert all(f"tensor<1x2x512x{dim}xf32>) -> tensor<1x512x2x{dim}xf32>" in t for t in transposes), (
            transposes
        )
