"""The forward's accumulator rescale skipped where alpha == 1 in a whole warp (``warp_rescale``).

On CPU: interpret mode multiplies as before, and the kernels lowered for CUDA vote once per
key-block loop of the ping-pong schedule, with the multiplies inside the branch. That skipping
leaves the output bitwise unchanged is a device check (``tests/test_gpu_suite.py``).
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ringcheck import mosaic_modules

from ringattention.kernels.hopper import pallas_hopper as ph
from ringattention.kernels.hopper import warp_rescale


def test_interpret_rescale_is_the_product():
    acc = jax.random.normal(jax.random.PRNGKey(0), (64, 128), jnp.float32)  # [bq, Dv]
    alpha = jnp.where(jnp.arange(64) % 3 == 0, 0.5, 1.0).astype(jnp.float32)  # [bq]
    got = warp_rescale.rescale(acc, alpha, interpret=True)
    np.testing.assert_array_equal(got, acc * alpha[:, None])


def _kernel_text(**kw) -> str:
    """The Mosaic GPU module of one forward step lowered for CUDA (2 x 512 tokens, 4:2 heads)."""
    q = jax.ShapeDtypeStruct((2, 512, 4, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 512, 2, 128), jnp.bfloat16)
    pos = jax.ShapeDtypeStruct((512,), jnp.int32)
    fwd = functools.partial(ph.forward_step, softmax_scale=128**-0.5, **kw)
    jax.clear_caches()
    with mosaic_modules() as texts:
        jax.jit(lambda q, k, v, p: fwd(q, k, v, p, p, None, None)).trace(q, kv, kv, pos).lower(
            lowering_platforms=("cuda",)
        )
    [text] = texts
    return text


@pytest.mark.parametrize(
    "kw, loops",
    [
        (dict(causal=True), 2),  # the fully visible key blocks, then the diagonal
        (dict(causal=True, window=200), 3),  # the window's far edge first
        (dict(causal=True, softcap=30.0), 2),
        (dict(causal=False, block_sizes=ph.BlockSizes(schedule="overlap", registers=240)), 0),
    ],
)
def test_pingpong_loops_vote_before_rescaling(kw, loops):
    """One warp vote per key-block loop of the ping-pong schedule (FA3's intra-warpgroup overlap
    keeps its unconditional rescale), each choosing between the rescaled accumulator and the
    accumulator itself."""
    text = _kernel_text(**kw)
    assert text.count("vote.sync.any.pred") == loops
    assert len(re.findall(r"scf.if .*-> \(vector<2xf32>", text)) == loops
