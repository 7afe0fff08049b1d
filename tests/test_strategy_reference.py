"""``strategy="all_gather" | "ulysses"`` against the float64 reference (``"auto"`` and the cost model:
test_strategy.py).

The all-gather (``ringattention.all_gather``) and pure Ulysses (``ulysses.whole_sequence_attention``)
run through ``ringcheck.check_ring`` like the ring: forward and dq/dk/dv on the global sequence, rings
of 1, 2, 3, 4 and 8, every layout, causal or not, GQA, segment ids, sliding windows. The default run
takes a rotating sample; the whole product is ``@pytest.mark.slow``. Also: the all-gather under
check_vma, bad strategies refused, ``sharded_attention(strategy=...)`` and the optional step
features in every strategy.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from ringcheck import F32_RTOL, Problem, check_ring, make_inputs, reference64, rel_err
from strategy_cases import BS, LAYOUTS

import ringattention
from ringattention import layouts
from ringattention import strategy as st
from ringattention._vma import _vma

RINGS = (1, 2, 3, 4, 8)
WINDOW = 20  # a sliding window shorter than the sequence of every case below (shard 16)

# (ring, layout, causal, segment ids, kv heads, window)
GATHER_FULL = list(itertools.product(RINGS, LAYOUTS, (True, False), (True, False), (1, 2, 4), (None, WINDOW)))
GATHER_DEFAULT = [
    (1, "contiguous", True, True, 2, None),
    (2, "striped", False, False, 4, WINDOW),
    (3, "contiguous", True, True, 1, WINDOW),
    (4, "zigzag", True, True, 2, None),
    (8, "striped", True, False, 1, WINDOW),
]
# ulysses: heads 8, so rings 1, 2, 4 and 8 divide them (3 is an error, tested below)
ULYSSES_FULL = [c for c in GATHER_FULL if 8 % c[0] == 0]
ULYSSES_DEFAULT = [
    (2, "zigzag", True, True, 1, None),
    (4, "striped", True, False, 2, WINDOW),
    (8, "contiguous", False, True, 4, None),
]


def _id(c):
    n, layout, causal, seg, kvh, w = c
    return (
        f"n{n}-{layout}-{'causal' if causal else 'full'}-{'seg' if seg else 'noseg'}-kv{kvh}"
        f"{'-w' if w else ''}"
    )


def _params(full, default):
    return [pytest.param(c, id=_id(c), marks=[] if c in default else [pytest.mark.slow]) for c in full]


def _problem(case, strategy, heads=4):
    n, layout, causal, seg, kvh, w = case
    return Problem(
        n=n,
        layout=layout,
        causal=causal,
        segments=seg,
        kv_heads=kvh,
        window=w,
        heads=heads,
        shard=16 if n < 8 else 8,
        strategy=strategy,
    )


@pytest.mark.parametrize("case", _params(GATHER_FULL, GATHER_DEFAULT))
def test_all_gather_matches_reference(case):
    check_ring(_problem(case, "all_gather"), implementation="xla", block_sizes=BS)


@pytest.mark.parametrize("case", _params(ULYSSES_FULL, ULYSSES_DEFAULT))
def test_ulysses_matches_reference(case):
    check_ring(_problem(case, "ulysses", heads=8), implementation="xla", block_sizes=BS)


@pytest.mark.parametrize("strategy", ["all_gather", pytest.param("ulysses", marks=pytest.mark.slow)])
def test_bfloat16(strategy):
    # bfloat16 inputs, float32 accumulators: within ringcheck.BF16_RTOL of the float64 reference
    check_ring(
        Problem(
            n=4,
            layout="zigzag",
            causal=True,
            segments=True,
            kv_heads=2,
            shard=8,
            dtype="bfloat16",
            strategy=strategy,
        ),
        implementation="xla",
        block_sizes=BS,
    )


@pytest.mark.parametrize(
    "chunks,layout",
    [
        (4, "zigzag"),
        pytest.param(1, "zigzag", marks=pytest.mark.slow),
        pytest.param(3, "contiguous", marks=pytest.mark.slow),
    ],
)
def test_all_gather_chunks(chunks, layout):
    # pieces of a zigzag shard: a quarter of the shard (4: shorter than a run), or one piece
    # spanning both runs (1); the window's skip test takes either
    check_ring(
        Problem(
            n=4,
            layout=layout,
            causal=True,
            segments=True,
            shard=12 if chunks == 3 else 8,
            window=6,
            strategy="all_gather",
        ),
        implementation="xla",
        block_sizes=BS,
        gather_chunks=chunks,
    )


def _per_device_grads(pb, strategy):
    """dk, dv of every device: [N, B, S, K, D] each (out_specs stack them by device)."""
    q, k, v, do, seg = make_inputs(pb)
    mesh = Mesh(np.array(jax.devices()[: pb.n]), ("sp",))
    to = lambda x: layouts.to_layout(jnp.asarray(x), pb.layout, pb.n)  # noqa: E731

    def local(q, k, v, do, seg):
        f = lambda k, v: ringattention.ring_attention(  # noqa: E731
            q,
            k,
            v,
            "sp",
            causal=pb.causal,
            segment_ids=seg,
            layout=pb.layout,
            implementation="xla",
            block_sizes=BS,
            strategy=strategy,
        )
        _, vjp = jax.vjp(f, k, v)
        return tuple(g[None] for g in vjp(do))

    spec = P(None, "sp")
    fn = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 5, out_specs=(P("sp"),) * 2))
    return fn(*(to(x) for x in (q, k, v, do, seg))), (q, k, v, do, seg)


def test_all_gather_inside_ulysses_groups():
    # USP with the all-gather on the ring axis: 2 Ulysses groups of 2, the exchange then a gather
    check_ring(
        Problem(
            n=2,
            ulysses=2,
            shard=8,
            layout="zigzag",
            causal=True,
            segments=True,
            kv_heads=1,
            strategy="all_gather",
        ),
        implementation="xla",
        block_sizes=BS,
    )
    cpu = jax.devices()[0]
    # auto with a Ulysses axis decides on the ring's view: 16-token shards, 2 heads, 1 kv head
    want = st.choose(st.Shape(2, 32, 2, 1, 16, 2, 4, layout="contiguous"), st.platform_of(cpu)).strategy
    got = st.resolve("auto", (2, 8, 4, 16), (2, 8, 1, 16), 4, "sp", 2, 2, True, cpu)
    assert got == want and got in ("ring", "all_gather")
    with pytest.raises(ValueError, match="ulysses_axis set"):
        st.resolve("ulysses", (2, 8, 4, 16), (2, 8, 1, 16), 4, "sp", 2, 2, True, cpu)


def test_all_gather_dk_dv_land_on_their_owners():
    pb = Problem(n=4, layout="zigzag", causal=True, segments=True, kv_heads=2, shard=8)
    (dk, dv), (q, k, v, do, seg) = _per_device_grads(pb, "all_gather")
    _, _, dk_ref, dv_ref = reference64(q, k, v, do, causal=True, seg=seg)
    for got, ref in ((dk, dk_ref), (dv, dv_ref)):
        # device r holds the gradient of its own shard: shard r of the layout order
        shards = (
            np.asarray(layouts.to_layout(jnp.asarray(ref), pb.layout, pb.n))
            .reshape(ref.shape[0], pb.n, pb.shard, *ref.shape[2:])
            .swapaxes(0, 1)
        )  # [N, B, S, K, D]
        for r in range(pb.n):
            assert rel_err(got[r], shards[r]) <= F32_RTOL, r


# ---- check_vma ---------------------------------------------------------------------------------


@pytest.mark.parametrize("implementation", ["xla", "pallas_gpu"])
def test_all_gather_under_check_vma(implementation):
    kw = dict(implementation=implementation, block_sizes=BS)
    if implementation == "pallas_gpu":
        from ringattention.kernels.triton import pallas_gpu as pg

        kw = dict(
            implementation="pallas_gpu",
            interpret=True,
            block_sizes=pg.BlockSizes(
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
            ),
        )
        # (every xla case of check_ring runs under check_vma=True already: ringcheck's default)
        check_ring(
            Problem(
                n=2, layout="zigzag", causal=True, segments=True, kv_heads=1, shard=16, strategy="all_gather"
            ),
            check_vma=True,
            gather_chunks=1,
            **kw,
        )
    seen = []
    mesh = Mesh(np.array(jax.devices()[:2]), ("sp",))

    def local(q, k):
        o = ringattention.ring_attention(q, k, k, "sp", causal=True, strategy="all_gather", **kw)
        seen.append(_vma(o))
        return o

    x = jnp.ones((1, 64, 4, 16), jnp.float32)
    jax.eval_shape(
        jax.shard_map(
            local, mesh=mesh, in_specs=(P(None, "sp"),) * 2, out_specs=P(None, "sp"), check_vma=True
        ),
        x,
        x[:, :, :1],
    )
    assert seen == [frozenset({"sp"})]  # the output varies like the inputs


# ---- errors -------------------------------------------------------------------------------------


def _call(n, heads, **kw):
    mesh = Mesh(np.array(jax.devices()[:n]), ("sp",))
    q = jnp.ones((1, 16 * n, heads, 8), jnp.float32)
    k = jnp.ones((1, 16 * n, 2, 8), jnp.float32)
    f = lambda q, k: ringattention.ring_attention(q, k, k, "sp", **kw)  # noqa: E731
    return jax.eval_shape(
        jax.shard_map(f, mesh=mesh, in_specs=(P(None, "sp"),) * 2, out_specs=P(None, "sp")), q, k
    )


@pytest.mark.parametrize(
    "n,heads,kw,match",
    [
        (
            2,
            4,
            dict(strategy="star"),
            r"strategy='star' is not known; choose one of \('ring', "
            r"'all_gather', 'ulysses', 'auto'\)",
        ),
        (4, 6, dict(strategy="ulysses"), r"heads=6, axis size 4"),
        (2, 4, dict(strategy="all_gather", gather_chunks=3), r"gather_chunks=3 .* shard length 16"),
        (
            2,
            4,
            dict(strategy="ring", gather_chunks=2),
            r"gather_chunks=2 applies to "
            r"strategy='all_gather' .* strategy='ring'",
        ),
    ],
)
def test_bad_strategy(n, heads, kw, match):
    with pytest.raises(ValueError, match=match):
        _call(n, heads, **kw)


def test_sharded_attention_strategy():
    mesh = Mesh(np.array(jax.devices()[:4]), ("sp",))
    q, k, v, _, seg = make_inputs(Problem(n=4, segments=True, heads=4, kv_heads=2))
    want = reference64(q, k, v, np.zeros_like(q), causal=True, seg=seg)[0]
    for strategy in ("all_gather", "ulysses"):
        out = jax.jit(
            lambda q, k, v, seg, strategy=strategy: ringattention.sharded_attention(
                q,
                k,
                v,
                mesh,
                segment_ids=seg,
                causal=True,
                layout="striped",
                implementation="xla",
                block_sizes=BS,
                strategy=strategy,
            )
        )(q, k, v, seg)
        assert rel_err(out, want) <= F32_RTOL, strategy
    with pytest.raises(ValueError, match="choose one of"):
        ringattention.sharded_attention(q, k, v, mesh, strategy="tree")


# ---- the optional step features (sinks, softcap, prefix, bidirectional segments, MLA shapes) ---

# (strategy, ring, layout, Problem keywords): every feature reaches the all-gather's steps and the
# Ulysses step; sinks are merged once after either
SINKS_ETC = dict(sinks=True, softcap=2.0, logit_scale=3.0, prefix=True, batch=3, window=5)
BIDIR_MLA = dict(bidirectional=True, segments=True, v_head_dim=8)
FEATURE_CASES = [
    pytest.param("all_gather", 4, "contiguous", SINKS_ETC, id="all_gather-n4-sinks-etc"),
    pytest.param("ulysses", 4, "striped", BIDIR_MLA, id="ulysses-n4-bidir-mla"),
    pytest.param("all_gather", 2, "zigzag", BIDIR_MLA, id="all_gather-n2-bidir-mla", marks=pytest.mark.slow),
    pytest.param(
        "ulysses",
        2,
        "zigzag",
        {**SINKS_ETC, "segments": True},
        id="ulysses-n2-sinks-etc",
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.parametrize("strategy,n,layout,kw", FEATURE_CASES)
def test_features_in_every_strategy(strategy, n, layout, kw):
    check_ring(
        Problem(n=n, layout=layout, causal=True, strategy=strategy, **kw),
        implementation="xla",
        block_sizes=BS,
    )
