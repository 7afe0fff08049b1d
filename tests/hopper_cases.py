"""What the tests of the Pallas Mosaic GPU (Hopper) step share: the interpret-mode marker, the
tolerances, a step's inputs and the checks of a forward and a backward step against the float32 step
references (``pallas_gpu.reference_forward_step`` / ``reference_backward_step``).

The kernel checks run in Mosaic GPU's interpret mode on CPU. Interpret mode executes the real
kernel structure (three warpgroups, TMA copies, barriers, the slot ring, masks from global positions
and segment ids); only wgmma and register layouts are replaced by plain ``jnp`` (``mosaic.Ops``), so
those are checked on the device only (``tools/hopper_check.py``). The interpreter simulates a single
GPU, so ring runs use one device; ring steps with other offsets are covered at the kernel level
(query block after, overlapping and before the key block).

The tests: test_hopper_forward.py, test_hopper_backward.py, test_hopper_window.py (sliding
windows) and test_hopper_ring.py (through ``ring_attention``) in interpret mode;
test_hopper_lowering.py (every kernel lowered for CUDA) and test_hopper_config.py (geometry, block
sizes, defaults, input checks), pure JAX.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from ringcheck import BF16_RTOL, F32_RTOL, rel_err

from ringattention.kernels.hopper import pallas_hopper as ph
from ringattention.kernels.triton import pallas_gpu as pg

needs_interpret = pytest.mark.skipif(
    ph.interpret_params() is None,
    reason="this jax has no Mosaic GPU interpret mode; pallas_hopper is checked on the device by "
    "tools/hopper_check.py",
)
RTOL = {"float32": F32_RTOL, "bfloat16": BF16_RTOL, "float16": BF16_RTOL}
LSE_ATOL = 1e-4  # natural-log units: lse is computed in float32 from exact half-precision products


def _inputs(rng, *, sq, sk, heads, kv_heads, dim, dtype, where, segments, stride=1, batch=2):
    f = lambda *s: jnp.asarray(rng.standard_normal(s), dtype)  # noqa: E731
    q, do = f(batch, sq, heads, dim), f(batch, sq, heads, dim)
    k, v = f(batch, sk, kv_heads, dim), f(batch, sk, kv_heads, dim)
    offset = {"after": sk * stride, "overlap": sk * stride // 2, "before": -sq * stride}[where]
    q_pos = jnp.asarray(np.arange(sq) * stride + offset, jnp.int32)
    k_pos = jnp.asarray(np.arange(sk) * stride, jnp.int32)
    seg = lambda n: jnp.asarray(np.sort(rng.integers(0, 3, (batch, n)), axis=1), jnp.int32)  # noqa: E731
    q_seg, k_seg = (seg(sq), seg(sk)) if segments else (None, None)
    return q, k, v, do, q_pos, k_pos, q_seg, k_seg


def _check_forward(inputs, causal, block_sizes=None, window=None):
    q, k, v, _, q_pos, k_pos, q_seg, k_seg = inputs
    kw = dict(causal=causal, softmax_scale=q.shape[-1] ** -0.5, window=window)
    o, lse = ph.forward_step(
        q, k, v, q_pos, k_pos, q_seg, k_seg, block_sizes=block_sizes, interpret=True, **kw
    )
    ro, rlse = pg.reference_forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, **kw)
    assert o.dtype == lse.dtype == jnp.float32
    assert o.shape == q.shape and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    lse, rlse = np.asarray(lse), np.asarray(rlse)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(rlse))
    finite = np.isfinite(rlse)
    if finite.any():
        assert np.abs(lse[finite] - rlse[finite]).max() <= LSE_ATOL
        assert rel_err(o, ro) <= RTOL[jnp.dtype(q.dtype).name]
    else:  # nothing visible: exactly zero
        assert np.all(np.asarray(o) == 0.0)
    return ro, rlse


def _check_backward(inputs, causal, block_sizes, window=None):
    q, k, v, do, q_pos, k_pos, q_seg, k_seg = inputs
    kw = dict(causal=causal, softmax_scale=q.shape[-1] ** -0.5, window=window)
    ro, rlse = pg.reference_forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, **kw)
    delta = jnp.einsum("bshd,bshd->bhs", ro, do.astype(jnp.float32))
    got = ph.backward_step(
        q, k, v, do, rlse, delta, q_pos, k_pos, q_seg, k_seg, block_sizes=block_sizes, interpret=True, **kw
    )
    want = pg.reference_backward_step(q, k, v, do, rlse, delta, q_pos, k_pos, q_seg, k_seg, **kw)
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert g.dtype == jnp.float32 and g.shape == w.shape, name
        if np.any(np.asarray(w)):
            assert rel_err(g, w) <= RTOL[jnp.dtype(q.dtype).name], name
        else:  # nothing visible: exactly zero
            assert np.all(np.asarray(g) == 0.0), name
    return got
