"""``strategy="all_gather" | "ulysses" | "auto"`` against the float64 reference, and the cost model.

The all-gather (``ringattention.all_gather``) and pure Ulysses (``ulysses.whole_sequence_attention``)
run through ``ringcheck.check_ring`` like the ring: forward and dq/dk/dv on the global sequence, rings
of 1, 2, 3, 4 and 8, every layout, causal or not, GQA, segment ids, sliding windows. The default run
takes a rotating sample; the whole product is ``@pytest.mark.slow``.
"""

import dataclasses
import importlib
import itertools
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from ringcheck import F32_RTOL, Problem, check_ring, make_inputs, reference64, rel_err

import ringattention
from models.config import get_config
from ringattention import BlockSizes, layouts, masks
from ringattention import strategy as st
from ringattention._vma import _vma
from ringattention.lap_plan import lap_plan

BS = BlockSizes(q_chunk=8, kv_chunk=8)  # several chunks per step: SKIP, PARTIAL and FULL all occur
RINGS = (1, 2, 3, 4, 8)
LAYOUTS = ("contiguous", "striped", "zigzag")
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


# ---- auto and the cost model ------------------------------------------------------------------

H100 = st.PLATFORMS["h100"]


@pytest.mark.parametrize(
    "seq,n,want",
    [
        (131072, 8, "ulysses"),  # 32 heads over 8: the all-to-alls send 3.3x fewer bytes
        (32768, 64, "all_gather"),  # 512-token shards: a hop (4.7 us) outlasts its step (3.6 us)
        (1048576, 64, "ring"),  # 16K-token shards hide the hop; 32 heads do not divide over 64
    ],
)
def test_choose_on_llama_8b(seq, n, want):
    dec = st.choose(st.Shape(1, seq, 32, 8, 128, n), H100)
    assert dec.strategy == want, dec.reason
    by = {r["strategy"]: r for r in dec.rows}
    assert by["all_gather"]["bytes_fwd"] == by["ring"]["bytes_fwd"]  # the same k/v arrive
    assert by["ulysses"]["feasible"] == (32 % n == 0)


def test_bytes_match_the_ulysses_docstring():
    # ulysses.py: (U - 1) / U S D (2 H + 2 K') per exchange; K' = 4 for K = 2 over 4 devices
    s = st.Shape(1, 64, 8, 2, 16, 4, dtype_bytes=4)
    assert st.bytes_sent(s, "ulysses")[0] == 3 / 4 * 16 * 16 * (2 * 8 + 2 * 4) * 4
    hop = 16 * 2 * 2 * 16  # one k, v shard
    assert st.bytes_sent(s, "ring") == (3 * hop * 4, 3 * hop * 4 + 2 * hop * 4 + 4 * hop * 4)
    # one layer compiled alone: XLA merges the backward's gathers with the forward's
    assert st.bytes_sent(s, "all_gather") == (3 * hop * 4, 3 * hop * 4 + 3 * hop * 4)


# (heads, kv heads, shard, ring, window) on the CPU constants -> the strategy auto must pick
AUTO_CASES = [
    ((4, 2, 16, 4, None), "ulysses"),
    ((2, 2, 16, 4, None), "all_gather"),
    ((3, 1, 64, 2, None), "ring"),
    ((2, 2, 16, 4, 4), "ring"),
]  # all_gather without the window: its short lap wins
SIGNATURE = {"ulysses": "all_to_all", "all_gather": "all_gather", "ring": "collective_permute"}


@pytest.mark.parametrize("dims,want", AUTO_CASES, ids=[f"{w}-w{d[-1]}" for d, w in AUTO_CASES])
def test_auto_picks_what_the_cost_model_says(dims, want):
    h, kvh, shard, n, w = dims
    cpu = st.platform_of(jax.devices()[0])
    assert (
        st.choose(st.Shape(2, shard * n, h, kvh, 16, n, 4, layout="zigzag", window=w), cpu).strategy == want
    )
    mesh = Mesh(np.array(jax.devices()[:n]), ("sp",))
    f = jax.shard_map(
        lambda q, k: ringattention.ring_attention(
            q,
            k,
            k,
            "sp",
            causal=True,
            layout="zigzag",
            sliding_window=w,
            strategy="auto",
            implementation="xla",
        ),
        mesh=mesh,
        in_specs=(P(None, "sp"),) * 2,
        out_specs=P(None, "sp"),
    )
    text = jax.jit(f).lower(jnp.ones((2, shard * n, h, 16)), jnp.ones((2, shard * n, kvh, 16))).as_text()
    used = {name for name, op in SIGNATURE.items() if f"stablehlo.{op}" in text}
    assert used == {want}, used
    check_ring(
        Problem(
            n=n, heads=h, kv_heads=kvh, shard=shard, layout="zigzag", segments=True, window=w, strategy="auto"
        ),
        implementation="xla",
        block_sizes=BlockSizes(16, 16),
    )


# ---- sliding windows, memory and the documented table in the cost model -------------------------

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _bench(name: str):
    """A script of benchmarks/ as a module."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_visible_pairs_count_the_mask(layout):
    for n, shard, causal, w in itertools.product((1, 3, 4), (4, 8), (True, False), (None, 1, 5)):
        got = layouts.visible_pairs(layout, n, shard, causal, w)
        for r, t in itertools.product(range(n), range(n)):
            q_pos = layouts.shard_positions(layout, shard, n, r)
            k_pos = layouts.shard_positions(layout, shard, n, (r - t) % n)
            assert got[r, t] == int(masks.visible(q_pos, k_pos, None, None, causal, w).sum())


def _planned_lap(layout, n, shard, causal, window):
    """(forward, backward) hops straight from lap_plan.lap_plan (a full lap: N - 1 forward)."""
    positions = layouts.permutation(n * shard, layout, n).reshape(n, shard)
    hops = lap_plan(positions, 2 if layout == "zigzag" else 1, causal, window)
    return hops if hops is not None else (n - 1, 0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_window_steps_and_bytes_follow_the_lap_plan(layout):
    shortened = False
    for (n, shard, w), causal in itertools.product(
        ((3, 16, 6), (4, 16, 6), (8, 16, 20), (8, 16, 40)), (True, False)
    ):
        s = st.Shape(1, n * shard, 4, 2, 8, n, 4, causal, layout=layout, window=w, v_head_dim=4)
        f, b = _planned_lap(layout, n, shard, causal, w)
        assert st.lap(s) == (f, b)
        shortened |= f + b < n - 1
        steps = st.ring_steps(s)
        assert sorted(steps) == sorted({0, *range(1, f + 1), *(n - j for j in range(1, b + 1))})
        skipped = [t for t in range(n) if t not in steps]
        assert not st.step_pairs(s)[:, skipped].any()  # what the lap leaves out sees nothing
        kv = shard * 2 * (8 + 4)  # elements of one k (head dim 8) and v (4) shard
        assert st.bytes_sent(s, "ring")[0] == (f + b) * kv * 4
        full = dataclasses.replace(s, window=None)  # a gather and the all-to-alls ignore windows
        for other in ("all_gather", "ulysses"):
            assert st.bytes_sent(s, other) == st.bytes_sent(full, other)
    assert shortened == (layout != "striped")  # striped shards span the sequence: full laps


@pytest.mark.parametrize(
    "layout,strategy",
    [
        ("contiguous", "ring"),
        ("striped", "ring"),
        ("zigzag", "ring"),
        pytest.param("zigzag", "all_gather", marks=pytest.mark.slow),
    ],
)  # as without a window
def test_window_bytes_match_the_compiled_hlo(layout, strategy):
    # n 8, shard 16, W 20: contiguous causal laps 2 hops forward (the backward's second is the
    # forward's: XLA unrolls the one-iteration loop), zigzag 3 each way, striped a full lap
    cb = _bench("cp_bytes")
    n, shard, w = 8, 16, 20
    mesh = Mesh(np.array(jax.devices()[:n]), ("sp",))
    attn = jax.shard_map(
        lambda q, k, v: ringattention.ring_attention(
            q,
            k,
            v,
            "sp",
            causal=True,
            layout=layout,
            sliding_window=w,
            implementation="xla",
            block_sizes=BS,
            strategy=strategy,
        ),
        mesh=mesh,
        in_specs=(P(None, "sp"),) * 3,
        out_specs=P(None, "sp"),
    )
    grad = jax.grad(lambda q, k, v: attn(q, k, v).sum(), argnums=(0, 1, 2))
    args = [jax.ShapeDtypeStruct((1, n * shard, h, d), jnp.float32) for h, d in ((4, 8), (2, 8), (2, 4))]
    got = tuple(
        cb.total(cb.hlo_collective_bytes(jax.jit(f).lower(*args).compile().as_text())) for f in (attn, grad)
    )
    s = st.Shape(1, n * shard, 4, 2, 8, n, 4, layout=layout, window=w, v_head_dim=4)
    assert got == st.bytes_sent(s, strategy)


def test_window_compute_counts_the_pairs_in_the_window():
    from models.flops import document_pairs

    L, W, n = 1 << 20, 4096, 8
    per_pair = 2 * 32 * (128 + 64) / H100.attention_flops_per_s  # q.k and p.v of 32 heads
    for layout in LAYOUTS:
        s = st.Shape(1, L, 32, 8, 128, n, layout=layout, window=W, v_head_dim=64)
        pairs = st.step_pairs(s)
        assert pairs.sum() == document_pairs(L, window=W)  # every visible pair once, any layout
        assert st.compute_seconds(s, H100, "ulysses") == pytest.approx(pairs.sum() / n * per_pair)
        gather = st.compute_seconds(s, H100, "all_gather")
        assert gather == pytest.approx(pairs.sum(1).max() * per_pair)
        assert st.compute_seconds(s, H100, "ring") >= gather  # a step waits for its slowest device
        unwindowed = dataclasses.replace(s, window=None)
        shrink = document_pairs(L, window=W) / document_pairs(L)
        assert st.compute_seconds(s, H100, "ulysses") == pytest.approx(
            st.compute_seconds(unwindowed, H100, "ulysses") * shrink
        )


def test_memory_counts_each_strategys_buffers():
    s = st.Shape(2, 4096, 8, 2, 64, 4, dtype_bytes=2, v_head_dim=32)
    B, S, L, H, K, D, Dv, b = 2, 1024, 4096, 8, 2, 64, 32, 2
    q_side = B * S * H * ((D + Dv) * b + 4 + D * 4)  # q, o; float32 lse and dq
    kv_side = B * S * K * (D + Dv) * (b + 4)  # k, v; float32 dk, dv
    assert st.memory_bytes(s, "ring") == q_side + 3 * kv_side  # + a shard held, one in flight
    piece = B * L // 2 * K * (D + Dv)  # of the gathered k/v, in 2 pieces
    assert st.memory_bytes(s, "all_gather") == q_side + kv_side + 2 * piece * b + piece * 4
    assert st.memory_bytes(s, "ulysses") == q_side + 2 * kv_side  # 2 kv heads repeated to 4


MQA = st.Shape(1, 131072, 8, 1, 128, 8)  # one kv head, which Ulysses repeats 8 times
# a shape where each strategy is the pick with memory to spare
ROOMY = {
    "ring": st.Shape(1, 1 << 20, 64, 8, 128, 8, window=4096),  # the window's lap sends least
    "all_gather": st.Shape(1, 32768, 32, 8, 128, 64),  # 512-token shards cannot hide a hop
    "ulysses": MQA,
}  # 8 heads: the all-to-alls send least, but K' = 8 kv heads need memory


@pytest.mark.parametrize("strategy", st.STRATEGIES)
def test_a_strategy_over_the_budget_is_never_picked(strategy):
    free = st.choose(ROOMY[strategy], H100, memory_budget=float("inf"))
    assert free.strategy == strategy, free.reason
    memory = {r["strategy"]: r["memory_bytes"] for r in free.rows}
    budget = memory[strategy] - 1
    assert min(memory.values()) <= budget  # another one fits
    dec = st.choose(ROOMY[strategy], H100, memory_budget=budget)
    by = {r["strategy"]: r for r in dec.rows}
    assert dec.strategy != strategy and by[dec.strategy]["memory_bytes"] <= budget, dec.reason
    assert not by[strategy]["feasible"] and "budget" in by[strategy]["why_not"]


def test_none_fits_takes_the_least_memory_and_says_so():
    dec = st.choose(ROOMY["all_gather"], H100, memory_budget=1.0)
    runs = [r for r in dec.rows if r["runs"]]
    assert dec.strategy == min(runs, key=lambda r: r["memory_bytes"])["strategy"]
    assert "none fits" in dec.reason
    for r in runs:  # the reason names every size
        assert f"{r['strategy']} {r['memory_bytes'] / st.GIB:,.2f} GiB" in dec.reason
    with pytest.raises(ValueError, match="strategy='tree'"):
        st.memory_bytes(MQA, "tree")


def test_docs_table_is_generated():
    table = _bench("strategy_table")
    doc = (ROOT / "docs" / "api.md").read_text()
    assert table.doc_block(doc) == table.markdown(), (
        "regenerate it: python benchmarks/strategy_table.py --write-doc"
    )


def _doc_pick(label: str, tokens: str, n: int) -> str:
    """The h100 pick docs/api.md shows for a model row, length and device count."""
    doc = (ROOT / "docs" / "api.md").read_text()
    h100 = doc[doc.index("| h100: model") : doc.index("| tpu_v5p: model")]
    (line,) = [x for x in h100.splitlines() if x.startswith(f"| {label} | ") and f"| {tokens} |" in x]
    return line.split(" | ")[4 + (1, 8, 64).index(n)].split(",")[0].strip(" |")


def _preset(name: str, seq: int, n: int, window=None) -> st.Shape:
    c = get_config(name)
    return st.Shape(1, seq, c.num_heads, c.num_kv_heads, c.head_dim, n, window=window)


def _ring_step(s: st.Shape) -> tuple[float, float]:
    """A zigzag causal step's compute (S^2 / 2 pairs, 2 H E flops each) and one k/v hop."""
    return (
        s.shard**2 / 2 * 2 * s.heads * s.kv_dims / H100.attention_flops_per_s,
        s.shard * s.kv_heads * s.kv_dims * 2 / H100.link_bytes_per_s,
    )


def test_table_ulysses_where_heads_divide_and_it_sends_less():
    s, n = _preset("8b", 131072, 8), 8
    kv = s.shard * s.kv_heads * s.kv_dims  # one k, v shard
    ring = (2 * n - 3) * kv * 2 + n * kv * 4  # forward and backward k/v hops, float32 dk/dv home
    ulysses = 2 * (n - 1) / n * s.shard * (s.heads + s.kv_heads) * s.kv_dims * 2
    assert s.heads % n == 0 and ulysses < ring
    assert st.choose(s, H100).strategy == "ulysses" == _doc_pick("8b", "128K", 8)
    s70 = _preset("70b", 32768, 64)  # 64 heads divide over 64 devices too
    assert st.choose(s70, H100).strategy == "ulysses" == _doc_pick("70b", "32K", 64)


def test_table_all_gather_where_a_short_shard_cannot_hide_its_hop():
    s = _preset("8b", 32768, 64)  # 512-token shards; 32 heads do not divide over 64
    compute, hop = _ring_step(s)
    assert s.heads % 64 and compute < hop
    assert st.choose(s, H100).strategy == "all_gather" == _doc_pick("8b", "32K", 64)


def test_table_ring_where_it_hides_or_its_window_lap_is_short():
    s = _preset("8b", 1 << 20, 64)  # 16K-token shards hide every hop
    compute, hop = _ring_step(s)
    assert compute >= hop and st.choose(s, H100).strategy == "ring" == _doc_pick("8b", "1M", 64)
    w = _preset("8b", 32768, 64, window=4096)  # the same 512-token shards, lapped in fewer hops
    assert sum(_planned_lap("zigzag", 64, w.shard, True, 4096)) < 63
    assert st.choose(w, H100).strategy == "ring" == _doc_pick("8b, window 4096", "32K", 64)


def test_table_one_device_over_budget_runs_the_ring_and_says_so():
    s = _preset("70b", 1 << 20, 1)
    L, H, K, D, E = s.seq, s.heads, s.kv_heads, s.head_dim, s.kv_dims
    memory = L * H * (2 * D * 2 + 4 + 4 * D) + L * K * E * (2 + 4)  # q, o, lse, dq; k, v, dk, dv
    assert memory > st.MEMORY_BUDGET_FRACTION * H100.memory_bytes
    dec = st.choose(s, H100)
    assert dec.strategy == "ring" and "budget" in dec.reason
    assert _doc_pick("70b", "1M", 1) == "ring"  # shown as "ring, over budget (...)"


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
