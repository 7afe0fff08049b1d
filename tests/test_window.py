"""Sliding-window attention through the ring ("xla" step): float64 reference, short laps, masks.

Windows smaller than a shard, equal to it, spanning several shards and longer than the sequence, on
rings of 1, 2, 3, 4 and 8, with causal / non-causal, segment ids, every layout and GQA: a covering
subset by default, the product under ``slow``. The short laps (contiguous and zigzag rings that stop
early) are checked for their dk/dv, which must come home, and for the number of ppermutes they run.
"""

import itertools

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from ringcheck import F32_RTOL, Problem, check_ring, make_inputs, rel_err, run_ring

import ringattention
from ringattention import BlockSizes, masks, ring, ring_step
from ringattention.lap_plan import lap_plan, runs

SHARD = 16
BS = BlockSizes(q_chunk=8, kv_chunk=8)  # 2 x 2 chunks per step: window edges inside a step
# Window sizes relative to the shard: below it, equal, spanning 2.5 shards, longer than any sequence.
WINDOWS = {"one": 1, "lt": 5, "eq": SHARD, "span": 40, "gt": 1000}
LAYOUTS = ("contiguous", "striped", "zigzag")


def _id(case):
    n, layout, causal, seg, kvh, w = case
    return f"n{n}-{layout}-{'causal' if causal else 'full'}-{'seg' if seg else 'noseg'}-kv{kvh}-w{w}"


# The slow product: every ring, layout and mask kind with windows inside a shard, equal to it and
# spanning shards, MHA and GQA (W = 1, W > L and 4 query heads per kv head: the default cases).
ALL_CASES = list(
    itertools.product((1, 2, 3, 4, 8), LAYOUTS, (True, False), (False, True), (1, 2), ("lt", "eq", "span"))
)
# A covering subset: every ring size, layout, window kind, mask kind and GQA ratio; the short laps
# (contiguous / zigzag with small windows) on rings of 3, 4 and 8, one way and both ways.
DEFAULT_CASES = [
    (1, "contiguous", True, True, 2, "lt"),
    (4, "striped", True, True, 1, "eq"),
    (2, "zigzag", True, True, 4, "span"),
    (3, "contiguous", True, False, 2, "eq"),  # a short lap of one hop
    (3, "zigzag", False, True, 1, "gt"),
    (4, "contiguous", False, False, 2, "one"),  # each query sees itself: no hop at all
    (4, "contiguous", True, True, 4, "lt"),  # one hop
    (8, "contiguous", False, True, 2, "lt"),  # one hop each way
    (8, "zigzag", True, False, 2, "lt"),  # one hop each way
    (8, "contiguous", True, True, 4, "eq"),  # one hop
]


def _case(case):
    n, layout, causal, seg, kvh, w = case
    check_ring(
        Problem(
            n=n, layout=layout, causal=causal, segments=seg, kv_heads=kvh, shard=SHARD, window=WINDOWS[w]
        ),
        implementation="xla",
        block_sizes=BS,
    )


@pytest.mark.parametrize("case", DEFAULT_CASES, ids=map(_id, DEFAULT_CASES))
def test_window_matrix(case):
    _case(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in ALL_CASES if c not in DEFAULT_CASES], ids=_id)
def test_window_matrix_full(case):
    _case(case)


def test_window_of_one_sends_nothing():
    """W = 1 on a contiguous ring: every query sees only itself; no shard moves, dk/dv stay home
    (values: ``n4-contiguous-full-noseg-kv2-wone`` of the matrix)."""
    fn, args = _grad_fn(4, "contiguous", False, 1)
    assert _count_permutes(jax.make_jaxpr(fn)(*args).jaxpr) == 0


@pytest.mark.slow
def test_window_bfloat16():
    check_ring(
        Problem(n=4, layout="zigzag", causal=True, segments=True, shard=SHARD, window=12, dtype="bfloat16"),
        implementation="xla",
        block_sizes=BS,
    )


def test_rows_without_visible_keys_are_finite():
    # Unique segment ids: each query sees only itself, so in every step but one, and in most
    # chunks, rows see nothing; with a window on top nothing may turn into NaN.
    pb = Problem(n=4, layout="contiguous", causal=False, segments=True, window=3, shard=SHARD)
    q, k, v, do, _ = make_inputs(pb)
    seg = np.tile(np.arange(q.shape[1], dtype=np.int32), (q.shape[0], 1))
    out = run_ring(pb, q, k, v, do, seg, implementation="xla", block_sizes=BS)
    for x in out:
        assert np.all(np.isfinite(x))
    np.testing.assert_allclose(out[0], np.repeat(v, 2, axis=2), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("window", [0, -3, 2.5, True, "4"])
def test_bad_window_is_rejected(window):
    q = jnp.zeros((1, 8, 2, 4), jnp.float32)
    f = lambda q: ringattention.ring_attention(q, q, q, "sp", sliding_window=window)
    with pytest.raises(ValueError, match="sliding_window"):
        jax.vmap(f, axis_name="sp")(q[None])
    with pytest.raises(ValueError, match="sliding_window"):
        ringattention.reference_attention(q, q, q, sliding_window=window)


# ---- short laps ---------------------------------------------------------------------------------

PLANS = [  # (layout, n, causal, window, (forward hops, backward hops) or None for a full lap)
    ("contiguous", 8, True, 5, (1, 0)),
    ("contiguous", 8, True, SHARD, (1, 0)),
    ("contiguous", 8, True, SHARD + 1, (1, 0)),  # query r*S reaches key r*S - S: shard r - 1
    ("contiguous", 8, True, 2 * SHARD, (2, 0)),
    ("contiguous", 8, True, 40, (3, 0)),
    ("contiguous", 8, False, SHARD, (1, 1)),
    ("contiguous", 3, False, SHARD, None),  # 1 + 1 hops: no cheaper than the full lap of 2
    ("contiguous", 4, True, 4 * SHARD, None),
    ("zigzag", 8, True, SHARD // 2, (1, 1)),  # chunk c sees chunk c - 1: shards r - 1 and r + 1
    ("zigzag", 8, True, SHARD, (2, 2)),
    ("striped", 8, True, 5, None),  # every shard holds positions next to every other's
    ("contiguous", 8, True, None, None),
    ("contiguous", 8, True, 1, (0, 0)),  # each query sees itself: no hop at all
]


@pytest.mark.parametrize("layout,n,causal,window,want", PLANS)
def test_lap_plan(layout, n, causal, window, want):
    positions = ringattention.layouts.permutation(n * SHARD, layout, n).reshape(n, SHARD)
    assert lap_plan(positions, runs(layout), causal, window) == want


def _inner(p):
    return p.jaxpr if isinstance(p, jex.ClosedJaxpr) else p


def _subjaxprs(eqn):
    return [_inner(p) for p in eqn.params.values() if isinstance(p, (jex.Jaxpr, jex.ClosedJaxpr))]


def _count_permutes(jaxpr) -> int:
    """ppermutes executed by a jaxpr: scan bodies count once per iteration, a cond its most
    expensive branch (the ring's steps skip compute with a cond, never a ppermute)."""
    total = 0
    for eqn in jaxpr.eqns:
        total += eqn.primitive.name == "ppermute"
        branches = eqn.params.get("branches", ())
        if branches:
            total += max(_count_permutes(_inner(b)) for b in branches)
        for sub in _subjaxprs(eqn):
            total += _count_permutes(sub) * eqn.params.get("length", 1)
    return total


def _perms(jaxpr, out=None) -> set:
    out = set() if out is None else out
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "ppermute":
            out.add(tuple(eqn.params["perm"]))
        for sub in _subjaxprs(eqn) + [_inner(b) for b in eqn.params.get("branches", ())]:
            _perms(sub, out)
    return out


def _grad_fn(n, layout, causal, window):
    mesh = Mesh(np.array(jax.devices()[:n]), ("sp",))
    spec = P(None, "sp")
    f = jax.shard_map(
        lambda q, k, v: ringattention.ring_attention(
            q,
            k,
            v,
            "sp",
            causal=causal,
            layout=layout,
            implementation="xla",
            sliding_window=window,
            block_sizes=BS,
        ),
        mesh=mesh,
        in_specs=(spec,) * 3,
        out_specs=spec,
    )
    g = jax.jit(jax.grad(lambda q, k, v: f(q, k, v).sum(), argnums=(0, 1, 2)))
    x = jax.ShapeDtypeStruct((1, n * SHARD, 2, 8), jnp.float32)
    return g, (x, x, x)


def _shift(perm, n):
    shifts = {(dst - src) % n for src, dst in perm}
    assert len(shifts) == 1, perm
    return shifts.pop()


@pytest.mark.parametrize(
    "layout,causal,window,hops", [("contiguous", True, SHARD, (1, 0)), ("zigzag", True, 6, (1, 1))]
)
def test_short_lap_runs_fewer_ppermutes(layout, causal, window, hops):
    """Executed ppermutes of forward + backward at N = 8 (k and v: two arrays per send): a full lap
    sends k/v 7 times per pass and dk/dv 8 times; a short lap of f + b hops sends k/v f + b times
    per pass and dk/dv f + b times plus one hop home per direction."""
    n = 8
    full_fn, args = _grad_fn(n, layout, causal, None)
    short_fn, _ = _grad_fn(n, layout, causal, window)
    full = _count_permutes(jax.make_jaxpr(full_fn)(*args).jaxpr)
    short_jaxpr = jax.make_jaxpr(short_fn)(*args).jaxpr
    short = _count_permutes(short_jaxpr)
    hop_count, dirs = sum(hops), sum(h > 0 for h in hops)
    assert full == 2 * ((n - 1) + (n - 1) + n)
    assert short == 2 * (hop_count + hop_count + (hop_count + dirs))
    # k/v one hop each way; dk/dv home again by the reverse shift of each half-lap
    assert {_shift(p, n) for p in _perms(short_jaxpr)} == {1, n - 1}
    # In the lowered program (where a scan body counts once) the one-hop lap has no scan and fewer
    # collective-permutes; the two unrolled half-laps of zigzag have as many as the full lap's text.
    hlo = lambda fn: fn.lower(*args).as_text().count("stablehlo.collective_permute")  # noqa: E731
    if hops == (1, 0):
        assert hlo(short_fn) == short < hlo(full_fn)


def test_sharded_attention_window_matches_reference():
    rng = np.random.default_rng(0)
    n, L = 2, 32
    q = jnp.asarray(rng.standard_normal((1, L, 4, 16)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((1, L, 2, 16)), jnp.float32) for _ in range(2))
    mesh = Mesh(np.array(jax.devices()[:n]), ("sp",))
    out = jax.jit(
        lambda q, k, v: ringattention.sharded_attention(
            q,
            k,
            v,
            mesh,
            causal=True,
            layout="zigzag",
            sliding_window=9,
            implementation="xla",
            block_sizes=BS,
        )
    )(q, k, v)
    ref = ringattention.reference_attention(q, k, v, causal=True, sliding_window=9)
    assert rel_err(out, ref) <= F32_RTOL


# ---- block classification -----------------------------------------------------------------------


@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("gapped", (False, True))
def test_block_table_with_window(causal, gapped):
    """FULL iff every pair is visible; SKIP only if none is, and iff none is for blocks of
    consecutive positions (gapped, e.g. striped, positions may give PARTIAL blocks that see none)."""
    rng = np.random.default_rng(int(causal) + 2 * int(gapped))
    step = 3 if gapped else 1
    q_pos = jnp.asarray(40 + step * np.arange(32), jnp.int32)
    k_pos = jnp.asarray(step * np.arange(48) + int(rng.integers(0, 20)), jnp.int32)
    seg = lambda n: jnp.asarray(np.sort(rng.integers(0, 3, (2, n)), -1), jnp.int32)  # noqa: E731
    q_seg, k_seg = seg(32), seg(48)
    for window in (1, 7, 30, 200):
        vis = np.asarray(masks.visible(q_pos, k_pos, q_seg, k_seg, causal, window))
        table = np.asarray(masks.block_table(q_pos, k_pos, q_seg, k_seg, causal, 8, 8, window))
        blocks = vis.reshape(2, 4, 8, 6, 8)
        any_, all_ = blocks.any((2, 4)), blocks.all((2, 4))
        np.testing.assert_array_equal(table == masks.FULL, all_)
        assert not np.any((table == masks.SKIP) & any_)
        if not gapped:
            pos_only = np.asarray(masks.block_table(q_pos, k_pos, None, None, causal, 8, 8, window))
            vis_pos = np.asarray(masks.visible(q_pos, k_pos, None, None, causal, window))
            np.testing.assert_array_equal(pos_only == masks.SKIP, ~vis_pos.reshape(1, 4, 8, 6, 8).any((2, 4)))


def test_step_visible_skips_steps_outside_the_window():
    """Zigzag, N = 4, chunks of 4: shard r holds chunks r and 7 - r. With W = 3 chunk c sees only
    chunks c and c - 1: shard 0 (chunks 0, 7) needs shards 0 and 1 (chunk 6), shard 1 (chunks 1, 6)
    needs shards 1, 0 (chunk 0) and 2 (chunk 5)."""
    cfg = ring._Config("sp", True, "zigzag", 1.0, "xla", None, False, 4, window=3)
    pos = lambda r: ringattention.layouts.shard_positions("zigzag", 8, 4, r)  # noqa: E731
    seen = [bool(ring_step.step_visible(cfg, pos(0), pos(r), None, None)) for r in range(4)]
    assert seen == [True, True, False, False]
    seen = [bool(ring_step.step_visible(cfg, pos(1), pos(r), None, None)) for r in range(4)]
    assert seen == [True, True, True, False]
