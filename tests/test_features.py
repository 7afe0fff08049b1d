"""Attention sinks, logit soft-capping, prefix-LM and bidirectional-segment masks, MLA shapes (v's own
head dim) through the ring ("xla" step), Ulysses, sharded_attention and reference_attention, against
the float64 reference (``ringcheck.reference64``), forward and gradients (dsinks included).

A covering subset of (ring size, layout, feature, GQA, segment ids) by default; the product under
``slow``.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from ringcheck import F32_RTOL, Problem, check_ring, make_extras, make_inputs, reference64, rel_err, run_ring

import ringattention
from ringattention import BlockSizes, implementations, sinks

BS = BlockSizes(q_chunk=8, kv_chunk=8)  # 2 x 2 chunks per step: SKIP, PARTIAL and FULL all occur
# Each feature alone, and combined (the window inside a shard: contiguous rings take a short lap,
# which the prefix turns into a two-way one).
FEATURES = {
    "sinks": dict(sinks=True),
    "softcap": dict(softcap=2.0, logit_scale=3.0),
    "prefix": dict(prefix=True, batch=3),
    "bidir": dict(bidirectional=True, segments=True),
    "mla": dict(v_head_dim=8),
    "all": dict(sinks=True, softcap=2.0, logit_scale=3.0, prefix=True, batch=3, window=5),
}
RINGS = (1, 2, 3, 4, 8)
LAYOUTS = ("contiguous", "striped", "zigzag")


def _problem(n, layout, feature, kv_heads, segments):
    kw = dict(FEATURES[feature])
    kw["segments"] = kw.get("segments", False) or segments
    return Problem(n=n, layout=layout, kv_heads=kv_heads, causal=True, **kw)


def _id(case):
    n, layout, feature, kvh, seg = case
    return f"n{n}-{layout}-{feature}-kv{kvh}-{'seg' if seg else 'noseg'}"


# Every ring size, layout, feature, GQA ratio and segment ids at least once; contiguous rings (which
# skip the steps a causal mask hides) for the masks that relax it.
DEFAULT_CASES = [
    (1, "contiguous", "sinks", 2, True),
    (3, "zigzag", "sinks", 1, False),
    (2, "zigzag", "softcap", 4, True),
    (4, "contiguous", "prefix", 2, True),
    (4, "contiguous", "bidir", 2, True),
    (8, "striped", "mla", 2, True),
    (4, "contiguous", "all", 2, True),
    (2, "zigzag", "all", 1, False),
]
ALL_CASES = list(itertools.product(RINGS, LAYOUTS, tuple(FEATURES), (1, 2, 4), (False, True)))


@pytest.mark.parametrize("case", DEFAULT_CASES, ids=map(_id, DEFAULT_CASES))
def test_feature_matrix(case):
    errs = check_ring(_problem(*case), implementation="xla", block_sizes=BS)
    assert len(errs) == (5 if FEATURES[case[2]].get("sinks") else 4)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in ALL_CASES if c not in DEFAULT_CASES], ids=_id)
def test_feature_matrix_full(case):
    check_ring(_problem(*case), implementation="xla", block_sizes=BS)


def test_ulysses_ring_with_sinks_and_softcap():
    # n=2 x U=2: each Ulysses rank gets its slice of the sinks; dsinks sums back over the slices
    check_ring(
        Problem(
            n=2, ulysses=2, shard=8, layout="zigzag", segments=True, sinks=True, softcap=2.0, prefix=True
        ),
        implementation="xla",
        block_sizes=BlockSizes(4, 4),
    )


def test_sinks_gradient_without_check_vma():
    # a user's shard_map(check_vma=False): dsinks per device, summed by shard_map's transpose
    check_ring(
        Problem(n=2, layout="striped", sinks=True, kv_heads=1),
        implementation="xla",
        block_sizes=BS,
        check_vma=False,
    )


def test_large_logits_with_softcap_and_sinks_stay_finite():
    # logits x100: tanh saturates; the sink and the lse merge relative to their max
    pb = Problem(n=2, layout="zigzag", segments=True, logit_scale=100.0, softcap=5.0, sinks=True)
    errs = check_ring(pb, implementation="xla", block_sizes=BS)
    assert all(np.isfinite(errs))


def test_sinks_with_steps_that_see_nothing():
    # Each query sees only itself (unique segment ids): most steps see nothing; with the sink the
    # output is v_self * sigmoid(s_self - sink) and nothing turns NaN.
    pb = Problem(n=4, layout="contiguous", segments=True, sinks=True)
    q, k, v, do, _ = make_inputs(pb)
    seg = np.tile(np.arange(q.shape[1], dtype=np.int32), (q.shape[0], 1))
    extras = make_extras(pb)
    got = run_ring(pb, q, k, v, do, seg, extras=extras, implementation="xla", block_sizes=BS)
    want = reference64(q, k, v, do, causal=True, seg=seg, sinks=extras["sinks"])
    for g, w in zip(got, want):
        assert rel_err(g, w) <= F32_RTOL


def test_sink_merge_of_rows_without_keys():
    # lse = -inf (a row that saw no key): o = 0 and lse_total = the sink, no NaN
    o = jnp.ones((1, 2, 2, 3))
    lse = jnp.array([[[-jnp.inf, 0.0], [-jnp.inf, 1.0]]])  # [B, H, S]
    snk = jnp.array([0.5, -2.0])
    o2, total = sinks.merge(o, lse, snk)
    np.testing.assert_array_equal(o2[0, 0], 0.0)
    np.testing.assert_allclose(total[0, :, 0], snk)
    np.testing.assert_allclose(o2[0, 1, 0], 1.0 / (1.0 + np.exp(0.5)), rtol=1e-6)
    assert np.all(np.isfinite(np.asarray(sinks.grad(snk, total, jnp.zeros_like(total)))))


def test_reference_attention_features_match_float64():
    pb = Problem(
        n=1,
        shard=12,
        batch=3,
        heads=4,
        kv_heads=2,
        segments=True,
        bidirectional=True,
        prefix=True,
        sinks=True,
        softcap=1.5,
        logit_scale=3.0,
        v_head_dim=6,
    )
    q, k, v, do, seg = make_inputs(pb)
    ex = make_extras(pb)
    got = ringattention.reference_attention(
        q,
        k,
        v,
        causal=True,
        segment_ids=seg,
        sinks=ex["sinks"],
        logits_soft_cap=1.5,
        prefix_length=ex["prefix"],
        bidirectional_segments=True,
    )
    want = reference64(
        q,
        k,
        v,
        do,
        causal=True,
        seg=seg,
        sinks=ex["sinks"],
        softcap=1.5,
        prefix=ex["prefix"],
        bidirectional=True,
    )[0]
    assert got.shape == (3, 12, 4, 6)
    assert rel_err(got, want) <= F32_RTOL


def test_reference_attention_rows_without_keys_and_sinks_are_zero():
    q, k, v = jnp.ones((1, 4, 2, 4)), jnp.ones((1, 4, 1, 4)), jnp.ones((1, 4, 1, 4))
    seg, kseg = jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32)
    out = ringattention.reference_attention(
        q, k, v, segment_ids=seg, kv_segment_ids=kseg, sinks=jnp.array([0.0, 3.0])
    )
    np.testing.assert_array_equal(out, 0.0)


def test_prefix_as_int_is_the_same_for_every_row():
    q, k, v, _, _ = make_inputs(Problem(n=1, shard=8, batch=2))
    a = ringattention.reference_attention(q, k, v, causal=True, prefix_length=3)
    b = ringattention.reference_attention(q, k, v, causal=True, prefix_length=jnp.array([3, 3]))
    np.testing.assert_array_equal(a, b)
    c = ringattention.reference_attention(q, k, v, causal=True)
    assert not np.allclose(a, c)


def test_sharded_attention_with_features():
    # batch over "dp" (prefix_length too), heads over "tp" (the sinks too), MLA v head dim
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("dp", "sp", "tp"))
    pb = Problem(
        n=2, shard=8, batch=2, heads=4, kv_heads=2, head_dim=8, v_head_dim=4, sinks=True, prefix=True
    )
    q, k, v, do, _ = make_inputs(pb)
    ex = make_extras(pb)
    kw = dict(
        seq_axis="sp",
        batch_axis="dp",
        head_axis="tp",
        causal=True,
        layout="zigzag",
        logits_soft_cap=2.0,
        prefix_length=jnp.asarray(ex["prefix"]),
        implementation="xla",
        block_sizes=BlockSizes(4, 4),
    )

    def loss(q, k, v, snk):
        o = ringattention.sharded_attention(q, k, v, mesh, sinks=snk, **kw)
        return (o * do).sum(), o

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True))
    grads, out = grad(q, k, v, jnp.asarray(ex["sinks"]))
    want = reference64(
        q, k, v, do, causal=True, seg=None, sinks=ex["sinks"], softcap=2.0, prefix=ex["prefix"]
    )
    assert out.shape == (2, 16, 4, 4)
    for g, w in zip((out, *grads), want):
        assert rel_err(g, w) <= F32_RTOL


def _ring_call(q, k, v, n=1, **kw):
    mesh = Mesh(np.array(jax.devices()[:n]), ("sp",))
    spec = P(None, "sp")
    seg = kw.pop("segment_ids", None)
    return jax.shard_map(
        lambda q, k, v, seg: ringattention.ring_attention(q, k, v, "sp", segment_ids=seg, **kw),
        mesh=mesh,
        in_specs=(spec,) * 4,
        out_specs=spec,
    )(q, k, v, seg)


BAD = [
    (dict(sinks=jnp.zeros((3,))), ValueError, r"sinks must be \[heads\] = \(4,\)"),
    (dict(sinks=jnp.zeros((4,), jnp.int32)), TypeError, "sinks.dtype"),
    (dict(prefix_length=2), ValueError, "prefix_length needs causal=True"),
    (dict(causal=True, prefix_length=jnp.zeros((2,), jnp.int32)), ValueError, r"prefix_length.shape=\(2,\)"),
    (dict(causal=True, prefix_length=jnp.zeros((1,))), TypeError, "prefix_length.dtype"),
    (dict(causal=True, prefix_length=-1), ValueError, "prefix_length=-1"),
    (
        dict(causal=True, prefix_length=np.asarray([-2], np.int32)),
        ValueError,
        r">= 0 in every row; got prefix_length=\[-2\]",
    ),
    (dict(logits_soft_cap=jnp.float32(-3.0)), ValueError, "logits_soft_cap=-3.0"),
    (dict(causal=True, bidirectional_segments=True), ValueError, "needs segment_ids"),
    (
        dict(bidirectional_segments=True, segment_ids=jnp.zeros((1, 16), jnp.int32)),
        ValueError,
        "needs causal=True",
    ),
    (dict(logits_soft_cap=0.0), ValueError, "logits_soft_cap=0.0"),
    (dict(logits_soft_cap=-1.0), ValueError, "logits_soft_cap"),
    (dict(v=jnp.ones((2, 16, 2, 4))), ValueError, "v.shape"),  # v's batch differs from k's
]


@pytest.mark.parametrize("bad, err, match", BAD)
def test_bad_feature_arguments_raise(bad, err, match):
    args = dict(q=jnp.ones((1, 16, 4, 8)), k=jnp.ones((1, 16, 2, 8)), v=jnp.ones((1, 16, 2, 8)))
    for name in ("q", "k", "v"):
        if name in bad:
            args[name] = bad.pop(name)
    with pytest.raises(err, match=match):
        _ring_call(args["q"], args["k"], args["v"], **bad)
    if "v" not in args or args["v"].shape[0] == 1:  # the same checks in reference_attention
        with pytest.raises(err, match=match):
            ringattention.reference_attention(args["q"], args["k"], args["v"], **bad)


def test_zero_dim_arrays_are_numbers():
    q, k = jnp.ones((1, 16, 4, 8)), jnp.ones((1, 16, 2, 8))
    want = ringattention.reference_attention(q, k, k, logits_soft_cap=3.0, softmax_scale=0.25)
    got = _ring_call(q, k, k, logits_soft_cap=jnp.float32(3.0), softmax_scale=np.asarray(0.25))
    assert rel_err(got, want) <= F32_RTOL
    with pytest.raises(TypeError, match="logits_soft_cap must be a concrete number"):
        jax.jit(lambda c: ringattention.reference_attention(q, k, k, logits_soft_cap=c))(3.0)


def test_bad_feature_arguments_raise_in_sharded_attention():
    mesh = Mesh(np.array(jax.devices()[:2]), ("sp",))
    q, k, v = jnp.ones((1, 16, 4, 8)), jnp.ones((1, 16, 2, 8)), jnp.ones((1, 16, 2, 8))
    with pytest.raises(ValueError, match="sinks"):
        ringattention.sharded_attention(q, k, v, mesh, sinks=jnp.zeros((2,)))
    with pytest.raises(ValueError, match="prefix_length needs causal"):
        ringattention.sharded_attention(q, k, v, mesh, prefix_length=4)


def _without(monkeypatch, name, lacks):
    """Registers ``name`` as the registry's entry with the features in ``lacks`` removed: every
    kernel claims every feature today, so the mechanism is tested on a kernel that does not."""
    impl = implementations._REGISTRY[name]
    monkeypatch.setitem(
        implementations._REGISTRY,
        name,
        implementations.dataclasses.replace(impl, features=impl.features - frozenset(lacks)),
    )


def test_resolve_needs(monkeypatch):
    every = {"softcap", "prefix", "bidirectional", "v_head_dim"}
    for name in ("xla", "pallas_gpu", "pallas_hopper", "pallas_tpu"):
        assert implementations._REGISTRY[name].features >= every, name
    assert implementations.resolve("xla", needs=every).name == "xla"
    # "auto" passes over kernels without a feature; on this CPU host it is "xla" either way
    assert implementations.resolve("auto", needs={"softcap"}).name == "xla"
    _without(monkeypatch, "pallas_hopper", {"softcap", "v_head_dim"})
    with pytest.raises(ValueError, match=r"pallas_hopper.*does not support \['softcap'\]"):
        implementations.resolve("pallas_hopper", needs={"softcap"})
    with pytest.raises(ValueError, match=r"\['softcap', 'v_head_dim'\].*xla"):
        implementations.resolve("pallas_hopper", needs={"v_head_dim", "softcap", "prefix"})
    assert implementations.resolve("pallas_hopper", needs={"prefix"}).name == "pallas_hopper"


def test_auto_skips_kernels_without_the_feature(monkeypatch):
    # A GPU mesh: "auto" would take pallas_hopper, but not with a feature it lacks
    monkeypatch.setattr(implementations, "platform", lambda mesh=None: "gpu")
    reg = dict(implementations._REGISTRY)
    for name in ("pallas_hopper", "pallas_gpu"):
        monkeypatch.setitem(
            implementations._REGISTRY,
            name,
            implementations.dataclasses.replace(reg[name], available=lambda m=None: True),
        )
    assert implementations.resolve("auto").name == "pallas_hopper"
    assert implementations.resolve("auto", needs={"prefix", "softcap"}).name == "pallas_hopper"
    _without(monkeypatch, "pallas_hopper", {"prefix"})
    assert implementations.resolve("auto", needs={"prefix"}).name == "pallas_gpu"
    assert implementations.resolve("auto", needs={"softcap"}).name == "pallas_hopper"
    _without(monkeypatch, "pallas_gpu", {"prefix"})
    assert implementations.resolve("auto", needs={"prefix"}).name == "xla"


def test_named_kernel_without_the_feature_raises_in_ring_attention(monkeypatch):
    _without(monkeypatch, "xla", {"softcap"})
    q, k, v = jnp.ones((1, 16, 4, 8)), jnp.ones((1, 16, 2, 8)), jnp.ones((1, 16, 2, 8))
    with pytest.raises(ValueError, match=r"implementation='xla' does not support \['softcap'\]"):
        _ring_call(q, k, v, implementation="xla", logits_soft_cap=3.0)
    assert _ring_call(q, k, v, implementation="xla").shape == q.shape  # the same call without it


def test_step_visible_with_prefix_and_bidirectional_segments():
    # contiguous ring of 4, shard 4: query shard 0 (positions 0..3) and key shard 2 (8..11)
    from ringattention import ring, ring_step

    q_pos, k_pos = jnp.arange(4), jnp.arange(8, 12)
    cfg = ring._Config("sp", True, "contiguous", 1.0, "xla", None, False, 4)
    assert not bool(ring_step.step_visible(cfg, q_pos, k_pos, None, None))
    pre = ring._Config("sp", True, "contiguous", 1.0, "xla", None, False, 4, prefix=True)
    assert bool(ring_step.step_visible(pre, q_pos, k_pos, None, None, jnp.array([0, 9])))
    assert not bool(ring_step.step_visible(pre, q_pos, k_pos, None, None, jnp.array([8, 2])))
    bi = ring._Config("sp", True, "contiguous", 1.0, "xla", None, False, 4, bidirectional=True)
    seg = jnp.array([[1, 1, -2, -2]]), jnp.array([[-2, -2, -2, 3]])
    assert bool(ring_step.step_visible(bi, q_pos, k_pos, *seg))
    assert not bool(ring_step.step_visible(bi, q_pos, k_pos, jnp.abs(seg[0]), seg[1]))
