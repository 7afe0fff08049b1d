"""Public API: input validation, sharded_attention on global arrays, blockwise_feedforward."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from ringcheck import F32_RTOL, reference64, rel_err

import ringattention
from ringattention import BlockSizes


def _call(q, k, v, n=2, **kw):
    mesh = Mesh(np.array(jax.devices()[:n]), ("sp",))
    seg = kw.pop("segment_ids", None)
    spec = P(None, "sp")

    def local(q, k, v, seg):
        return ringattention.ring_attention(q, k, v, "sp", segment_ids=seg, **kw)

    return jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3 + (spec,), out_specs=spec)(q, k, v, seg)


def _qkv(L=16, H=4, K=2, D=8, dtype=jnp.float32):
    return (jnp.ones((1, L, H, D), dtype), jnp.ones((1, L, K, D), dtype), jnp.ones((1, L, K, D), dtype))


@pytest.mark.parametrize(
    "bad, err, match",
    [
        (dict(q=jnp.ones((1, 16, 3, 8))), ValueError, "heads"),
        (dict(q=jnp.ones((16, 4, 8))), ValueError, "q.shape"),
        (dict(k=jnp.ones((1, 16, 2, 4)), v=jnp.ones((1, 16, 2, 4))), ValueError, "head_dim"),
        (dict(k=jnp.ones((1, 8, 2, 8)), v=jnp.ones((1, 8, 2, 8))), ValueError, "shard length"),
        (dict(v=jnp.ones((1, 16, 1, 8))), ValueError, "v.shape"),  # v's head dim alone may differ
        (dict(k=jnp.ones((1, 16, 2, 8), jnp.bfloat16)), TypeError, "dtype"),
        (dict(q=jnp.ones((1, 16, 4, 8), jnp.int32)), TypeError, "floating"),
        (dict(layout="spiral"), ValueError, "layout="),
        (dict(implementation="cuda_magic"), ValueError, "implementation="),
        (dict(segment_ids=jnp.zeros((1, 15), jnp.int32)), ValueError, "segment_ids"),
        (dict(segment_ids=jnp.zeros((1, 16), jnp.float32)), TypeError, "segment_ids"),
        (dict(softmax_scale=-1.0), ValueError, "softmax_scale"),
    ],
)
def test_bad_input_raises(bad, err, match):
    q, k, v = _qkv()
    args = dict(q=q, k=k, v=v)
    for name in ("q", "k", "v"):
        if name in bad:
            args[name] = bad.pop(name)
    kw = dict(bad)
    if "segment_ids" in kw:  # wrong-length ids can't go through shard_map: call directly
        mesh_kw = kw.pop("segment_ids")
        with pytest.raises(err, match=match):
            jax.shard_map(
                lambda q, k, v: ringattention.ring_attention(q, k, v, "sp", segment_ids=mesh_kw),
                mesh=Mesh(np.array(jax.devices()[:1]), ("sp",)),
                in_specs=(P(),) * 3,
                out_specs=P(),
            )(q, k, v)
        return
    with pytest.raises(err, match=match):
        _call(args["q"], args["k"], args["v"], n=1, **kw)


def test_kernel_on_wrong_platform_raises():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="pallas_gpu"):
        _call(q, k, v, n=1, implementation="pallas_gpu")


def test_zigzag_odd_shard_raises():
    q, k, v = _qkv(L=6)
    with pytest.raises(ValueError, match="zigzag"):
        _call(q, k, v, n=2, layout="zigzag")


@pytest.mark.parametrize("layout", ("contiguous", "zigzag"))
def test_sharded_attention_on_global_arrays(layout):
    # batch over "dp", sequence over "sp", heads over "tp": 2 x 2 x 2 devices.
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("dp", "sp", "tp"))
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 32, 4, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, 32, 2, 8)).astype(np.float32) for _ in range(2))
    seg = np.repeat(np.array([[0, 1, 1, 2]]), 8, axis=1).repeat(2, 0).astype(np.int32)
    out = ringattention.sharded_attention(
        q,
        k,
        v,
        mesh,
        seq_axis="sp",
        batch_axis="dp",
        head_axis="tp",
        segment_ids=seg,
        causal=True,
        layout=layout,
        implementation="xla",
        block_sizes=BlockSizes(4, 4),
    )
    want = reference64(q, k, v, np.zeros_like(q), causal=True, seg=seg)[0]
    assert rel_err(out, want) <= F32_RTOL


def test_a_tuple_of_mesh_axes_is_one_ring():
    """``axis_name=("a", "b")``: a 2 x 3 mesh's six devices form one ring, the first axis major
    (the shards of ``P(None, ("a", "b"))``), forward and gradients against float64."""
    mesh, layout = Mesh(np.array(jax.devices()[:6]).reshape(2, 3), ("a", "b")), "zigzag"
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 48, 4, 8)).astype(np.float32)
    k, v = (rng.standard_normal((1, 48, 2, 8)).astype(np.float32) for _ in range(2))
    do = rng.standard_normal(q.shape).astype(np.float32)
    spec = P(None, ("a", "b"))
    ring = jax.shard_map(
        lambda q, k, v: ringattention.ring_attention(
            q,
            k,
            v,
            ("a", "b"),
            causal=True,
            layout=layout,
            implementation="xla",
            block_sizes=BlockSizes(4, 4),
        ),
        mesh=mesh,
        in_specs=(spec,) * 3,
        out_specs=spec,
    )
    to = lambda x: ringattention.layouts.to_layout(x, layout, 6)  # noqa: E731
    back = lambda x: ringattention.layouts.from_layout(x, layout, 6)  # noqa: E731
    loss = lambda q, k, v: jnp.sum(back(ring(to(q), to(k), to(v))) * do)  # noqa: E731
    out = back(ring(to(q), to(k), to(v)))
    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    want, *want_grads = reference64(q, k, v, do, causal=True, seg=None)
    assert rel_err(out, want) <= F32_RTOL
    for got, ref in zip(grads, want_grads, strict=True):
        assert rel_err(got, ref) <= F32_RTOL


def test_sharded_attention_bad_mesh_axis():
    mesh = Mesh(np.array(jax.devices()[:2]), ("sp",))
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="head_axis='tp'"):
        ringattention.sharded_attention(q, k, v, mesh, head_axis="tp")


def test_reference_attention_matches_float64():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 12, 4, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, 12, 1, 8)).astype(np.float32) for _ in range(2))
    seg = np.array([[0] * 5 + [1] * 7, [3] * 12], np.int32)
    got = ringattention.reference_attention(q, k, v, causal=True, segment_ids=seg)
    assert rel_err(got, reference64(q, k, v, np.zeros_like(q), causal=True, seg=seg)[0]) <= F32_RTOL


def test_blockwise_feedforward_matches_and_saves_memory():
    rng = np.random.default_rng(3)
    w1 = jnp.asarray(rng.standard_normal((16, 256)), jnp.float32)
    w2 = jnp.asarray(rng.standard_normal((256, 16)), jnp.float32)
    mlp = lambda x: jax.nn.gelu(x @ w1) @ w2
    x = jnp.asarray(rng.standard_normal((2, 1024, 16)), jnp.float32)
    got = ringattention.blockwise_feedforward(mlp, x, 128)
    assert rel_err(got, mlp(x)) <= F32_RTOL
    loss = lambda f: lambda x: (f(x) ** 2).sum()
    chunked = loss(lambda x: ringattention.blockwise_feedforward(mlp, x, 128))
    g1, g2 = jax.grad(chunked)(x), jax.grad(loss(mlp))(x)
    assert rel_err(g1, g2) <= F32_RTOL
    mem = lambda f: jax.jit(jax.grad(f)).lower(x).compile().memory_analysis().temp_size_in_bytes
    # hidden activations [2, 1024, 256] f32 = 2 MiB whole; chunked they are 1/8 of that
    assert mem(chunked) < 0.5 * mem(loss(mlp))
    with pytest.raises(ValueError, match="chunk_size=100"):
        ringattention.blockwise_feedforward(mlp, x, 100)


def _sharded(q, k, v, **kw):
    mesh = Mesh(np.array(jax.devices()[:4]), ("sp",))
    return ringattention.sharded_attention(q, k, v, mesh, implementation="xla", **kw)


@pytest.mark.parametrize("fn", ["reference", "sharded", "ring"])
def test_causal_must_be_a_bool(fn):
    q, k, v = (np.asarray(x) for x in _qkv())
    call = {
        "reference": ringattention.reference_attention,
        "sharded": _sharded,
        "ring": lambda q, k, v, **kw: _call(q, k, v, n=2, **kw),
    }[fn]
    with pytest.raises(TypeError, match="causal='no' must be a bool"):
        call(q, k, v, causal="no")
    with pytest.raises(TypeError, match="causal=1 must be a bool"):
        call(q, k, v, causal=1)
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal(x.shape).astype(np.float32) for x in (q, k, v))
    full = ringattention.reference_attention(q, k, v, causal=False)
    np.testing.assert_allclose(call(q, k, v, causal=np.bool_(False)), full, rtol=1e-5, atol=1e-5)


def test_numpy_scalars_are_numbers():
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 16, 4, 8)).astype(np.float32)
    k, v = (rng.standard_normal((1, 16, 2, 8)).astype(np.float32) for _ in range(2))
    want = ringattention.reference_attention(q, k, v, causal=True, softmax_scale=0.25)
    for scale in (np.float32(0.25), np.float64(0.25)):
        got = ringattention.reference_attention(q, k, v, causal=True, softmax_scale=scale)
        np.testing.assert_array_equal(got, want)
    ring = _sharded(q, k, v, causal=True, softmax_scale=np.float32(0.25), sliding_window=np.int64(5))
    np.testing.assert_allclose(
        ring,
        ringattention.reference_attention(q, k, v, causal=True, softmax_scale=0.25, sliding_window=5),
        rtol=1e-5,
        atol=1e-5,
    )
    for bad in (np.float32(0.0), np.float32("nan"), True, "0.25"):
        with pytest.raises(ValueError, match="softmax_scale="):
            ringattention.reference_attention(q, k, v, softmax_scale=bad)


@pytest.mark.parametrize("fn", ["reference", "sharded"])
def test_segment_ids_shape_error_names_the_expected_shape(fn):
    q, k, v = (np.asarray(x) for x in _qkv())
    call = ringattention.reference_attention if fn == "reference" else _sharded
    for bad in (np.zeros(16, np.int32), np.zeros((2, 16), np.int32)):
        with pytest.raises(
            ValueError,
            match=r"segment_ids must be \[batch, seq\] = \(1, 16\); "
            f"got segment_ids.shape={re.escape(str(bad.shape))}",
        ):
            call(q, k, v, segment_ids=bad)


def test_windows_up_to_the_int32_range():
    rng = np.random.default_rng(6)
    q = rng.standard_normal((1, 16, 4, 8)).astype(np.float32)
    k, v = (rng.standard_normal((1, 16, 2, 8)).astype(np.float32) for _ in range(2))
    want = ringattention.reference_attention(q, k, v, causal=True)
    for window in (2**31 - 1, 2**31, np.int64(2**40)):
        got = ringattention.reference_attention(q, k, v, causal=True, sliding_window=window)
        np.testing.assert_array_equal(got, want)
    for window in (2**31 - 1, np.int64(2**40)):
        ring = _sharded(q, k, v, causal=True, sliding_window=window)
        np.testing.assert_allclose(ring, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="sliding_window=0"):
        ringattention.reference_attention(q, k, v, sliding_window=0)
