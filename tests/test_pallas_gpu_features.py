"""The optional step features of the Pallas GPU (Triton) step (``implementations.py``): soft cap,
prefix, bidirectional segments and v's own head dim, alone and together, in interpret mode against
the float32 step references and a float64 step; their lowering for CUDA (an H200, deviceless) and
the checks of their keywords. What the pallas_gpu tests share: pallas_gpu_cases.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pallas_gpu_cases import BS_MIXED, RTOL, FeatureCase, _assert_close, _feature_inputs
from ringcheck import F32_RTOL, h200_devices, on_device

from ringattention import masks
from ringattention.kernels.triton import pallas_gpu as pg


def _step64(inputs, causal, softmax_scale, window, softcap, prefix, bidirectional):
    """float64 numpy forward and backward of one step: o, lse, delta, dq, dk, dv (the backward on
    this step's own lse and delta)."""
    q, k, v, do = (np.asarray(x, np.float64) for x in inputs[:4])
    B, Sq, H, D = q.shape
    K, G = k.shape[2], H // k.shape[2]
    vis = np.asarray(masks.visible(*inputs[4:], causal, window, prefix=prefix, bidirectional=bidirectional))[
        :, None, None
    ]  # [B|1,1,1,Sq,Sk]
    qg, dog = q.reshape(B, Sq, K, G, D), do.reshape(B, Sq, K, G, -1)
    s = np.einsum("bqkgd,bskd->bkgqs", qg, k) * softmax_scale
    t = np.tanh(s / softcap) if softcap is not None else None
    s = np.where(vis, s if t is None else softcap * t, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    l = np.exp(s - m).sum(-1, keepdims=True)  # noqa: E741
    p = np.exp(s - m) / np.where(l > 0, l, 1.0)  # [B, K, G, Sq, Sk]
    lse = np.where(l[..., 0] > 0, m[..., 0] + np.log(np.where(l > 0, l, 1.0))[..., 0], -np.inf)
    o = np.einsum("bkgqs,bskd->bqkgd", p, v).reshape(B, Sq, H, -1)
    delta = np.einsum("bqhd,bqhd->bhq", o, do)
    dp = np.einsum("bqkgd,bskd->bkgqs", dog, v)
    ds = p * (dp - delta.reshape(B, K, G, Sq)[..., None]) * softmax_scale
    ds = ds if t is None else ds * (1.0 - t * t)
    dq = np.einsum("bkgqs,bskd->bqkgd", ds, k).reshape(B, Sq, H, D)
    dk = np.einsum("bkgqs,bqkgd->bskd", ds, qg)
    dv = np.einsum("bkgqs,bqkgd->bskd", p, dog)
    return o, lse.reshape(B, H, Sq), delta, dq, dk, dv


def _check_features(case: FeatureCase, block_sizes=BS_MIXED):
    inputs = _feature_inputs(case)
    q, k, v, do, q_pos, k_pos, q_seg, k_seg = inputs
    kw = case.keywords()
    o64, lse64, delta64, *grads64 = _step64(inputs, **kw)
    lse, delta = jnp.asarray(lse64, jnp.float32), jnp.asarray(delta64, jnp.float32)
    o, lse_k = pg.forward_step(
        q, k, v, q_pos, k_pos, q_seg, k_seg, block_sizes=block_sizes, interpret=True, **kw
    )
    grads = pg.backward_step(
        q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, block_sizes=block_sizes, interpret=True, **kw
    )
    ro, rlse = pg.reference_forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, **kw)
    rgrads = pg.reference_backward_step(q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, **kw)
    kernel, ref32, ref64 = (o, lse_k, *grads), (ro, rlse, *rgrads), (o64, lse64, *grads64)
    _assert_close(kernel, ref32, RTOL[case.dtype], "kernel vs float32 reference")
    _assert_close(kernel, ref64, RTOL[case.dtype], "kernel vs float64")
    _assert_close(ref32, ref64, F32_RTOL, "float32 reference vs float64")
    assert np.any(np.isfinite(lse64)), "the step sees nothing: a vacuous case"


FEATURE_CASES = [
    FeatureCase(softcap=2.0),  # causal, GQA
    FeatureCase(dtype="bfloat16", causal=False, segments=True, kv_heads=1, softcap=1.5),
    FeatureCase(segments=True, softcap=2.0, window=20, offset=8, sk=64),  # ragged window edge
    FeatureCase(causal=False, kv_heads=4, softcap=3.0, window=24, sq=40),  # ragged query shard
    FeatureCase(prefix=(30, 0), stride=2),  # row 0 sees keys ahead of it, row 1 is plain causal
    FeatureCase(dtype="bfloat16", prefix=(50, 17), window=24, sq=32, sk=64),  # 24..49: prefix, not window
    FeatureCase(segments=True, bidirectional=True, sq=40),
    FeatureCase(dtype="bfloat16", segments=True, bidirectional=True, kv_heads=1, offset=16),
    FeatureCase(causal=False, dim=48, dim_v=32),  # head dims padded separately: 64 and 32
    FeatureCase(dtype="bfloat16", segments=True, dim=24, dim_v=16, sk=40),
    FeatureCase(segments=True, softcap=2.0, prefix=(20, 40), bidirectional=True, dim=32, dim_v=16),
    FeatureCase(
        segments=True,
        softcap=2.5,
        prefix=(12, 50),
        bidirectional=True,
        window=28,
        dim_v=48,
        kv_heads=1,
        offset=4,
        sk=64,
    ),
]


@pytest.mark.parametrize("case", FEATURE_CASES, ids=str)
def test_step_features_match_references(case):
    _check_features(case)


def _lowered_triton_calls(fn, *args) -> int:
    """Triton custom calls of ``fn`` lowered for an H200 (Pallas' Triton lowering, which since jax
    0.11 reads the target GPU from the devices: XLA's deviceless ones, no GPU needed)."""
    h200 = h200_devices(1)[0]
    with jax.default_device(h200):
        text = jax.jit(fn).trace(*on_device(h200, *args)).lower().as_text()
    return text.count("xla.gpu.triton")


@pytest.mark.parametrize("causal", (True, False))
def test_step_features_lower_for_cuda(causal):
    """tanh, the scalar prefix per batch row and separate head dims (192 and 128, MLA's) go
    through Triton's lowering: one kernel forward, two backward."""
    q = jax.ShapeDtypeStruct((2, 256, 4, 192), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 256, 2, 192), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((2, 256, 2, 128), jnp.bfloat16)
    do = jax.ShapeDtypeStruct((2, 256, 4, 128), jnp.bfloat16)
    pos, seg = jax.ShapeDtypeStruct((256,), jnp.int32), jax.ShapeDtypeStruct((2, 256), jnp.int32)
    lse = jax.ShapeDtypeStruct((2, 4, 256), jnp.float32)
    kw = dict(causal=causal, softmax_scale=0.1, softcap=30.0, window=100)
    if causal:
        kw.update(bidirectional=True, prefix=jnp.asarray([64, 0], jnp.int32))

    def fwd(q, k, v, p, s):
        return pg.forward_step(q, k, v, p, p, s, s, **kw)

    def bwd(q, k, v, do, lse, delta, p, s):
        return pg.backward_step(q, k, v, do, lse, delta, p, p, s, s, **kw)

    assert _lowered_triton_calls(fwd, q, k, v, pos, seg) == 1
    assert _lowered_triton_calls(bwd, q, k, v, do, lse, lse, pos, seg) == 2


def test_feature_keywords_are_checked():
    q, k, v, _, q_pos, k_pos, q_seg, k_seg = _feature_inputs(FeatureCase(segments=True))
    kw = dict(softmax_scale=0.1, interpret=True)
    prefix = jnp.asarray([4, 0], jnp.int32)
    with pytest.raises(ValueError, match="prefix needs causal"):
        pg.forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, causal=False, prefix=prefix, **kw)
    with pytest.raises(ValueError, match="batch"):
        pg.forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, causal=True, prefix=prefix[:1], **kw)
    with pytest.raises(ValueError, match="segment ids"):
        pg.forward_step(q, k, v, q_pos, k_pos, None, None, causal=True, bidirectional=True, **kw)
    with pytest.raises(ValueError, match="softcap"):
        pg.forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, causal=True, softcap=0.0, **kw)
    with pytest.raises(ValueError, match="bad shapes"):  # v's own head dim, but not its own length
        pg.forward_step(q, k, v[:, :8, :, :16], q_pos, k_pos, q_seg, k_seg, causal=True, **kw)
