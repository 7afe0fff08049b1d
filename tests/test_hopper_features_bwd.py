"""The optional step features in the Pallas Mosaic GPU (Hopper) backwards: softcap, prefix,
bidirectional segments and v's own head dim (``implementations.py``), for every backward.

Each Mosaic GPU backward (the fused one at head dims 64 and 128 and MLA's 192 / 128, the two-kernel
"mosaic" one that ``deterministic=True`` runs, the head-dim-split pair above 128: Gemma 2's 256 with
a soft cap and MLA's 192 / 128) runs in Mosaic GPU's interpret mode on CPU against the float32 step
reference ``pallas_gpu.reference_backward_step``, the forward's lse and delta taken from the
reference forward; every kernel is also lowered for CUDA under both lowering semantics (jax 0.10's
lane and jax >= 0.11's warpgroup). Interpret mode is slow: the default run checks each backward with
every feature at once (and a window, segment ids, GQA, a ragged shard); the slow marker has each
feature alone.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hopper_cases import needs_interpret
from jax.experimental.pallas import mosaic_gpu as plgpu
from ringcheck import BF16_RTOL, F32_RTOL, mosaic_modules, rel_err

from ringattention.kernels.hopper import backward as hb
from ringattention.kernels.hopper import cta_dq_bwd as hcb
from ringattention.kernels.hopper import pallas_hopper as ph
from ringattention.kernels.hopper import split_bwd as hsb
from ringattention.kernels.triton import pallas_gpu as pg

RTOL = {"float32": F32_RTOL, "bfloat16": BF16_RTOL, "float16": BF16_RTOL}
SOFTCAP = 5.0  # small enough that tanh bends logits of unit size

# name: (head dim, v's head dim where it has its own, BlockSizes)
BACKWARDS = {
    "fused64": (64, 128, ph.BlockSizes(backward="fused")),
    "fused128": (128, 64, ph.BlockSizes(backward="fused", registers=240)),
    "mosaic": (64, 128, ph.deterministic_block_sizes(None, 64)),  # 128-key dq blocks
    "split256": (256, 128, None),  # Gemma 2's head dim: the default, the head-dim-split pair
    "mla": (192, 128, None),  # MLA, q/k 192 (not padded), v 128: the default, fused (3 dq tiles)
    "split_mla": (192, 128, ph.BlockSizes(backward="mosaic")),  # MLA's head-dim-split pair
}


def _kernels(name: str, dim: int, v_dim: int) -> int:
    """Mosaic GPU kernels the backward ``name`` runs at these head dims: 1 fused, 2 as a pair."""
    bs = BACKWARDS[name][2] or ph.default_block_sizes(dim, True, v_head_dim=v_dim)
    return 1 if bs.backward == "fused" else 2


# Documents of the two batch rows (ids by global position): row 0 starts documents at 120 and
# 160, row 1 at 40. With ``bidirectional`` the second document of each row is bidirectional
# (id -1): row 0's queries at 120-159 see keys up to 159, row 1's queries see keys up to the
# end of the shard (199), beyond a window of 60.
DOCS = ((120, 160), (40,))


def _inputs(
    rng,
    *,
    dim,
    v_dim=None,
    sq=72,
    sk=200,
    heads=2,
    kv_heads=1,
    batch=2,
    offset=100,
    segments=True,
    bidirectional=False,
    dtype="bfloat16",
    logits=1.0,
):
    """q, k, v, do, positions, ids of a step (queries at offset.., keys at 0..; documents ``DOCS``);
    ``logits``: scales q and k by its square root."""
    f = lambda scale, *s: jnp.asarray(rng.standard_normal(s) * scale, dtype)  # noqa: E731
    v_dim = v_dim or dim
    q, k = f(logits**0.5, batch, sq, heads, dim), f(logits**0.5, batch, sk, kv_heads, dim)
    v, do = f(1.0, batch, sk, kv_heads, v_dim), f(1.0, batch, sq, heads, v_dim)
    q_pos = jnp.asarray(np.arange(sq) + offset, jnp.int32)
    k_pos = jnp.arange(sk, dtype=jnp.int32)
    q_seg = k_seg = None
    if segments:

        def ids(pos):  # [batch, n]
            doc = np.stack(
                [np.searchsorted(np.asarray(DOCS[b]), np.asarray(pos), side="right") for b in range(batch)]
            )
            return jnp.asarray(np.where(bidirectional & (doc == 1), -1, doc), jnp.int32)

        q_seg, k_seg = ids(q_pos), ids(k_pos)
    return q, k, v, do, q_pos, k_pos, q_seg, k_seg


def _check(inputs, block_sizes, *, causal=True, **features):
    """backward_step (interpret mode) against the reference; returns dq, dk, dv."""
    q, k, v, do, q_pos, k_pos, q_seg, k_seg = inputs
    kw = dict(causal=causal, softmax_scale=q.shape[-1] ** -0.5, **features)
    ro, rlse = pg.reference_forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, **kw)
    delta = jnp.einsum("bshd,bshd->bhs", ro, do.astype(jnp.float32))
    got = ph.backward_step(
        q, k, v, do, rlse, delta, q_pos, k_pos, q_seg, k_seg, block_sizes=block_sizes, interpret=True, **kw
    )
    want = pg.reference_backward_step(q, k, v, do, rlse, delta, q_pos, k_pos, q_seg, k_seg, **kw)
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert g.dtype == jnp.float32 and g.shape == w.shape, (name, g.shape, w.shape)
        assert np.all(np.isfinite(np.asarray(g))), name
        if np.any(np.asarray(w)):
            assert rel_err(g, w) <= RTOL[jnp.dtype(q.dtype).name], name
        else:  # nothing visible: exactly zero
            assert np.all(np.asarray(g) == 0.0), name
    return got


def _prefix(batch, offset):
    """Row 0's prefix reaches 10 past the first query's position (keys after the first queries
    visible), row 1's covers every key of the step (whole blocks fully visible, without a window)."""
    return jnp.asarray([offset + 10, 1000][:batch], jnp.int32)


# split256: make test-all only; MLA's opt-in split pair: .venv's jax only (every jax runs it with
# each feature alone and lowers it for CUDA, below)
AT_ONCE_MARKS = {"split256": pytest.mark.slow, "split_mla": pytest.mark.once}


@needs_interpret
@pytest.mark.parametrize("name", [pytest.param(n, marks=AT_ONCE_MARKS.get(n, ())) for n in BACKWARDS])
def test_every_feature_at_once(name):
    """softcap, prefix, bidirectional segments and v's own head dim together, with a sliding
    window (two-sided where the prefix and the bidirectional segments widen the causal mask),
    segment ids, GQA and a ragged query shard, for each backward (head dim 256 with its soft cap
    by default in ``test_rows_that_see_nothing_and_huge_logits``, here only under the slow marker:
    the split pair's kernels are MLA's)."""
    dim, v_dim, bs = BACKWARDS[name]
    rng = np.random.default_rng(dim + v_dim)
    inputs = _inputs(rng, dim=dim, v_dim=v_dim, bidirectional=True)
    _check(inputs, bs, softcap=SOFTCAP, prefix=_prefix(2, 100), bidirectional=True, window=60)


@pytest.mark.slow
@needs_interpret
@pytest.mark.parametrize("feature", ["softcap", "prefix", "bidirectional", "v_head_dim"])
@pytest.mark.parametrize("name", list(BACKWARDS))
def test_each_feature_alone(name, feature):
    dim, v_dim, bs = BACKWARDS[name]
    rng = np.random.default_rng(dim + len(feature))
    inputs = _inputs(
        rng,
        dim=dim,
        v_dim=v_dim if feature == "v_head_dim" else None,
        bidirectional=feature == "bidirectional",
        segments=feature != "prefix",
    )
    features = {
        "softcap": dict(softcap=SOFTCAP),
        "prefix": dict(prefix=_prefix(2, 100)),
        "bidirectional": dict(bidirectional=True),
        "v_head_dim": {},
    }[feature]
    _check(inputs, bs, **features)


@needs_interpret
@pytest.mark.parametrize("name", ["fused64", "split256"])
def test_rows_that_see_nothing_and_huge_logits(name):
    """Logits 100x their usual size under a soft cap stay finite (tanh saturates), and rows that
    see no key (queries before every key, a prefix of 0) get exactly zero gradients, no NaN."""
    dim, _, bs = BACKWARDS[name]
    rng = np.random.default_rng(21)
    inputs = _inputs(rng, dim=dim, sq=64, sk=128, batch=1, offset=-64, segments=False, logits=100.0)
    dq, dk, dv = _check(inputs, bs, softcap=SOFTCAP, prefix=jnp.zeros((1,), jnp.int32))
    assert not np.any(np.asarray(dq)) and not np.any(np.asarray(dk)) and not np.any(np.asarray(dv))
    # queries at -32..31: the first half sees no key, in the same (masked) blocks as the second
    inputs = _inputs(rng, dim=dim, sq=64, sk=128, batch=1, offset=-32, segments=False, logits=100.0)
    dq, _, _ = _check(inputs, bs, softcap=SOFTCAP)
    assert not np.any(np.asarray(dq)[:, :32]) and np.any(np.asarray(dq)[:, 32:])


def test_float32_runs_the_triton_step_with_the_features():
    rng = np.random.default_rng(7)
    inputs = _inputs(rng, dim=16, v_dim=32, sq=32, sk=48, offset=16, dtype="float32", bidirectional=True)
    _check(inputs, None, softcap=SOFTCAP, prefix=_prefix(2, 16), bidirectional=True, window=60)


def _shapes(dim, v_dim, segments=True):
    sd = jax.ShapeDtypeStruct
    B, S, H, K = 1, 384, 4, 2
    return (
        sd((B, S, H, dim), jnp.bfloat16),
        sd((B, S, K, dim), jnp.bfloat16),
        sd((B, S, K, v_dim), jnp.bfloat16),
        sd((B, S, H, v_dim), jnp.bfloat16),
        sd((B, H, S), jnp.float32),
        sd((B, H, S), jnp.float32),
        sd((S,), jnp.int32),
        sd((B, S), jnp.int32) if segments else None,
        sd((B,), jnp.int32),
    )


LOWER_FEATURES = {
    "softcap": dict(softcap=30.0),
    "prefix": dict(prefix=True),
    "bidirectional": dict(bidirectional=True),
    "all": dict(softcap=30.0, prefix=True, bidirectional=True, window=100, v_head_dim=True),
}


@pytest.mark.parametrize("semantics", ["default", "warpgroup"])
@pytest.mark.parametrize("feature", list(LOWER_FEATURES))
@pytest.mark.parametrize("name", list(BACKWARDS))
def test_features_lower_for_cuda(name, feature, semantics, monkeypatch):
    """Every backward with each feature goes through Mosaic GPU's lowering for CUDA (no GPU
    needed), under both lowering semantics; with a soft cap its tanh is the approximate one."""
    jax.clear_caches()
    if semantics == "warpgroup":
        monkeypatch.setattr(
            plgpu,
            "CompilerParams",
            functools.partial(plgpu.CompilerParams, lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        )
    dim, v_dim, bs = BACKWARDS[name]
    features = dict(LOWER_FEATURES[feature])
    with_prefix = features.pop("prefix", False)
    own_v = features.pop("v_head_dim", False)
    args = _shapes(dim, v_dim if own_v else dim)

    def bwd(q, k, v, do, lse, delta, pos, seg, prefix):
        return ph.backward_step(
            q,
            k,
            v,
            do,
            lse,
            delta,
            pos,
            pos,
            seg,
            seg,
            causal=True,
            softmax_scale=dim**-0.5,
            block_sizes=bs,
            prefix=prefix if with_prefix else None,
            **features,
        )

    text = jax.jit(bwd).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    want = _kernels(name, dim, v_dim if own_v else dim)
    assert text.count("stablehlo.custom_call @mosaic_gpu") == want


def test_softcap_tanh_is_approximate():
    """The soft cap costs one tanh per probability (as many as exp2s in the kernel), the
    approximate one (``tanh.approx.f32``, one MUFU op; ``math.tanh`` with ``afn`` before Mosaic
    GPU's warpgroup-semantics lowering turns it into that), as the kernels' ``CompilerParams(
    approx_math=True)`` asks."""
    q, k, v, do, lse, delta, pos, seg, _ = _shapes(64, 64, segments=False)
    for softcap in (None, 30.0):
        jax.clear_caches()
        step = functools.partial(
            ph.backward_step,
            causal=True,
            softmax_scale=0.125,
            softcap=softcap,
            block_sizes=ph.BlockSizes(backward="fused"),
        )
        with mosaic_modules() as kernels:
            jax.jit(step).trace(q, k, v, do, lse, delta, pos, pos, None, None).lower(
                lowering_platforms=("cuda",)
            )
        assert len(kernels) == 1
        text = kernels[0]
        exact = re.findall(r"math\.tanh [^\n]*", text)
        tanh = text.count("tanh.approx.f32") + sum("fastmath<afn>" in t for t in exact)
        exp2 = text.count("ex2.approx") + len(re.findall(r"math\.exp2 ", text))
        assert all("fastmath<afn>" in t for t in exact), exact
        assert exp2 > 0 and tanh == (0 if softcap is None else exp2), (tanh, exp2)


def _lse(q):
    return jax.ShapeDtypeStruct((q.shape[0], q.shape[2], q.shape[1]), jnp.float32)


@pytest.mark.parametrize(
    "bad,match",
    [
        (dict(softcap=0.0), "softcap"),
        (dict(softcap=-1.0), "softcap"),
        (dict(softcap=True), "softcap"),
        (dict(softcap=float("nan")), "softcap"),
        (dict(prefix=jnp.zeros((2,), jnp.int32)), "prefix.shape"),
        (dict(prefix=jnp.zeros((1,), jnp.int32), causal=False), "prefix needs causal"),
        (dict(bidirectional=True, segments=False), "bidirectional=True needs"),
        (dict(bidirectional=True, causal=False), "bidirectional=True needs"),
        (dict(do_dim=64), "do.shape"),
        (dict(backward="fused", v_dim=256), "head dim 256 .q/k 128, v 256. is above 128"),
        (dict(backward="fused", v_dim=192, dim=64), "above 128"),
    ],
)
def test_bad_keywords_are_value_errors(bad, match):
    """Bad feature keywords (and shapes) raise ValueError naming them, before any kernel is traced,
    in float32 (the Triton step) as in bfloat16."""
    bad = dict(bad)
    dim, v_dim = bad.pop("dim", 128), bad.pop("v_dim", 128)
    do_dim = bad.pop("do_dim", v_dim)
    segments = bad.pop("segments", True)
    backward = bad.pop("backward", "mosaic")
    causal = bad.pop("causal", True)
    for dtype in (jnp.bfloat16, jnp.float32):
        q = jnp.zeros((1, 64, 2, dim), dtype)
        k, v = jnp.zeros((1, 64, 1, dim), dtype), jnp.zeros((1, 64, 1, v_dim), dtype)
        do = jnp.zeros((1, 64, 2, do_dim), dtype)
        lse = jnp.zeros((1, 2, 64), jnp.float32)
        pos = jnp.arange(64, dtype=jnp.int32)
        seg = jnp.zeros((1, 64), jnp.int32) if segments else None
        with pytest.raises(ValueError, match=match):
            ph.backward_step(
                q,
                k,
                v,
                do,
                lse,
                lse,
                pos,
                pos,
                seg,
                seg,
                causal=causal,
                softmax_scale=0.1,
                block_sizes=ph.BlockSizes(backward=backward),
                interpret=True,
                **bad,
            )


@pytest.fixture
def backward_used(monkeypatch):
    """Which Mosaic backward module ``backward_step`` calls, and its keywords (without running it)."""
    calls = []

    def fake(name):
        def backward(q, k, v, *args, bs, **kw):
            calls.append((name, bs.backward, kw))
            return (
                jnp.zeros(q.shape, jnp.float32),
                jnp.zeros(k.shape, jnp.float32),
                jnp.zeros(v.shape, jnp.float32),
            )

        return backward

    for name, module in (("mosaic", hb), ("fused", hcb), ("split", hsb)):
        monkeypatch.setattr(module, "backward", fake(name))
    return calls


@pytest.mark.parametrize(
    "dim,v_dim,want",
    [
        (64, 64, "mosaic"),
        (128, 64, "mosaic"),
        (64, 128, "mosaic"),
        (256, 256, "split"),
        (192, 128, "split"),
        (128, 256, "split"),
    ],
)
def test_deterministic_picks_an_ordered_backward_with_features(dim, v_dim, want, backward_used):
    """``deterministic=True``'s block sizes (``deterministic_block_sizes``) with every feature
    on run the two-kernel backward or the head-dim-split pair (fixed summation order, no
    reduce-adds), which get the features; the defaults of the same call run the fused backward
    up to 128 and at MLA's 192 / 128 (``fused_takes``)."""
    q = jax.ShapeDtypeStruct((2, 128, 4, dim), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 128, 2, dim), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((2, 128, 2, v_dim), jnp.bfloat16)
    do = jax.ShapeDtypeStruct((2, 128, 4, v_dim), jnp.bfloat16)
    lse, pos = _lse(q), jax.ShapeDtypeStruct((128,), jnp.int32)
    seg = jax.ShapeDtypeStruct((2, 128), jnp.int32)
    kw = dict(causal=True, softmax_scale=0.1, softcap=30.0, bidirectional=True, window=50, interpret=True)
    for bs in (ph.deterministic_block_sizes(None, dim, True), None):
        step = functools.partial(ph.backward_step, block_sizes=bs, **kw)
        jax.eval_shape(
            lambda *a, step=step: step(*a, prefix=jnp.asarray([3, 5], jnp.int32)),
            q,
            k,
            v,
            do,
            lse,
            lse,
            pos,
            pos,
            seg,
            seg,
        )
    (name, backward, got), (default_name, _, _) = backward_used
    assert (name, backward) == (want, "mosaic")
    assert default_name == ("fused" if ph.fused_takes(dim, v_dim) else "split")
    assert got["softcap"] == 30.0 and got["bidirectional"] is True and got["window"] == 50
    assert got["prefix"].shape == (2,) and got["prefix"].dtype == jnp.int32


def test_features_off_pass_nothing(backward_used):
    """Without features the Mosaic backwards get exactly the keywords they always got (so their
    configs, and kernels, are those without features)."""
    q = jax.ShapeDtypeStruct((1, 128, 2, 64), jnp.bfloat16)
    lse, pos = _lse(q), jax.ShapeDtypeStruct((128,), jnp.int32)
    jax.eval_shape(
        functools.partial(ph.backward_step, causal=True, softmax_scale=0.1, interpret=True),
        q,
        q,
        q,
        q,
        lse,
        lse,
        pos,
        pos,
        None,
        None,
    )
    [(_, _, kw)] = backward_used
    assert set(kw) == {"causal", "softmax_scale", "interpret"}
    assert hb.features(None, None, False) == {}


@pytest.mark.parametrize("name", list(BACKWARDS))
def test_features_lower_inside_shard_map_check_vma(name):
    """Every feature at once inside a user's ``shard_map(check_vma=True)`` (the prefix sharded over
    the batch axis, so it varies like q), lowered for CUDA: the prefix scalar a kernel reads and
    the float32 dq accumulator Ref of the fused backward type-check."""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    dim, v_dim, bs = BACKWARDS[name]
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "sp"))

    def local(q, k, v, do, lse, delta, seg, prefix):
        pos = jnp.arange(q.shape[1], dtype=jnp.int32) + jax.lax.axis_index("sp") * q.shape[1]
        return ph.backward_step(
            q,
            k,
            v,
            do,
            lse,
            delta,
            pos,
            pos,
            seg,
            seg,
            causal=True,
            softmax_scale=0.1,
            block_sizes=bs,
            softcap=30.0,
            prefix=prefix,
            bidirectional=True,
            window=100,
        )

    rows, heads = P("dp", "sp"), P("dp", None, "sp")
    fn = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(rows,) * 4 + (heads, heads, rows, P("dp")),
        out_specs=(rows,) * 3,
        check_vma=True,
    )
    sd = jax.ShapeDtypeStruct
    args = (
        sd((2, 512, 4, dim), jnp.bfloat16),
        sd((2, 512, 2, dim), jnp.bfloat16),
        sd((2, 512, 2, v_dim), jnp.bfloat16),
        sd((2, 512, 4, v_dim), jnp.bfloat16),
        sd((2, 4, 512), jnp.float32),
        sd((2, 4, 512), jnp.float32),
        sd((2, 512), jnp.int32),
        sd((2,), jnp.int32),
    )
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("stablehlo.custom_call @mosaic_gpu") == _kernels(name, dim, v_dim)


def test_split_pair_pads_each_head_dim():
    """The head-dim-split pair pads q/k and v separately only where v has its own head dim (MLA's
    192 / 128 stay 192 / 128), plain head dims 129-256 to 256 as before; every such pair fits
    shared memory with the default 2 stages."""
    assert hsb.padded_dims(192, 192) == (256, 256) and hsb.padded_dims(256, 256) == (256, 256)
    assert hsb.padded_dims(192, 128) == (192, 128) and hsb.padded_dims(130, 64) == (192, 64)
    assert hsb.padded_dims(64, 200) == (64, 256)
    for d, dv in ((256, 256), (192, 128), (256, 128), (128, 256), (64, 256)):
        assert hsb.smem_bytes(jnp.bfloat16, 2, True, True, d, dv) <= hb.SMEM_LIMIT - 4096, (d, dv)
