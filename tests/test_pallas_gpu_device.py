"""The Pallas GPU (Triton) ring step on a CUDA device only (``JAX_PLATFORMS=cuda``; on CPU these
are skipped): the compiled kernels against cuDNN and a float32 reference at 16K tokens, and with
every optional feature against the float32 step reference. What the pallas_gpu tests share:
pallas_gpu_cases.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pallas_gpu_cases import FeatureCase, _assert_close, _feature_inputs
from ringcheck import BF16_RTOL, rel_err

from ringattention import reference_attention
from ringattention.kernels.triton import pallas_gpu as pg

# bf16 kernels against cuDNN on device: error vs float32 reference at most this factor of cuDNN's.
DEVICE_ERR_FACTOR = 1.5

on_gpu = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a CUDA GPU")


def _grads(fn, q, k, v, do):
    o, vjp = jax.vjp(fn, q, k, v)
    return (o, *vjp(do.astype(o.dtype)))


@on_gpu
@pytest.mark.parametrize("causal", (True, False))
@pytest.mark.parametrize("dims", ((8, 2, 128), (4, 4, 64)), ids=("gqa-d128", "mha-d64"))
def test_device_matches_cudnn_at_16k(causal, dims):
    heads, kv_heads, dim = dims
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("sp",))
    spec = jax.sharding.PartitionSpec(None, "sp")
    ring = jax.shard_map(
        lambda q, k, v: pg_ring(q, k, v, causal),
        mesh=mesh,
        in_specs=(spec,) * 3,
        out_specs=spec,
        check_vma=False,
    )
    cudnn = lambda q, k, v: jax.nn.dot_product_attention(  # noqa: E731
        q, k, v, is_causal=causal, implementation="cudnn"
    )
    ref = lambda q, k, v: reference_attention(q, k, v, causal=causal)  # noqa: E731
    keys = jax.random.split(jax.random.PRNGKey(dim + causal), 4)
    shape = lambda h: (1, 16384, h, dim)  # noqa: E731
    q, do = (jax.random.normal(keys[i], shape(heads), jnp.bfloat16) for i in (0, 3))
    k, v = (jax.random.normal(keys[i], shape(kv_heads), jnp.bfloat16) for i in (1, 2))
    f32 = [x.astype(jnp.float32) for x in (q, k, v, do)]
    want = jax.jit(lambda *a: _grads(ref, *a))(*f32)
    ours = jax.jit(lambda *a: _grads(ring, *a))(q, k, v, do)
    base = jax.jit(lambda *a: _grads(cudnn, *a))(q, k, v, do)
    for name, o, b, w in zip(("o", "dq", "dk", "dv"), ours, base, want, strict=True):
        err, base_err = rel_err(o, w), rel_err(b, w)
        print(f"{name}: pallas_gpu {err:.2e} cudnn {base_err:.2e} vs f32; ours vs cudnn {rel_err(o, b):.2e}")
        assert err <= DEVICE_ERR_FACTOR * base_err, name


@on_gpu
@pytest.mark.parametrize("causal", (True, False))
def test_device_features_match_reference(causal):
    """The compiled kernels with every feature (MLA's head dims 192 and 128, soft cap, window and,
    causal, a prefix per row and bidirectional segments) against the float32 reference step."""
    case = FeatureCase(
        dtype="bfloat16",
        causal=causal,
        segments=True,
        kv_heads=2,
        sq=2048,
        sk=2048,
        dim=192,
        dim_v=128,
        softcap=30.0,
        window=1500,
        prefix=(700, 0) if causal else None,
        bidirectional=causal,
    )
    q, k, v, do, q_pos, k_pos, q_seg, k_seg = _feature_inputs(case)
    kw = case.keywords()
    fwd = jax.jit(lambda *a: pg.forward_step(*a, **kw))
    bwd = jax.jit(lambda *a: pg.backward_step(*a, **kw))
    o, lse = fwd(q, k, v, q_pos, k_pos, q_seg, k_seg)
    ro, rlse = pg.reference_forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, **kw)
    delta = jnp.einsum("bshd,bshd->bhs", ro, do.astype(jnp.float32))
    grads = bwd(q, k, v, do, rlse, delta, q_pos, k_pos, q_seg, k_seg)
    rgrads = pg.reference_backward_step(q, k, v, do, rlse, delta, q_pos, k_pos, q_seg, k_seg, **kw)
    _assert_close((o, lse, *grads), (ro, rlse, *rgrads), BF16_RTOL, "compiled vs reference")


def pg_ring(q, k, v, causal):
    from ringattention import ring_attention

    return ring_attention(q, k, v, "sp", causal=causal, implementation="pallas_gpu")
