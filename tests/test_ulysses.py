"""Ulysses x ring (2-D context parallelism) against the float64 reference on the global sequence.

Meshes of Ulysses size U in {1, 2, 4} times ring size N in {1, 2, 4} (U N <= 8 CPU devices): the
sequence in layout order for the ring of N is split over ("sp", "usp"), heads are exchanged over "usp"
(``ringattention.ulysses``). Output and dq/dk/dv are checked like the ring's (``ringcheck``).
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from ringcheck import F32_RTOL, Problem, check_ring, reference64, rel_err

import ringattention
from ringattention import BlockSizes, ulysses

BS = BlockSizes(q_chunk=8, kv_chunk=8)  # several chunks per ring shard: SKIP/PARTIAL/FULL all occur
# (Ulysses size, ring size) with U * N <= 8
GRIDS = [(u, n) for u in (1, 2, 4) for n in (1, 2, 4) if u * n <= 8]
LAYOUTS = ("contiguous", "striped", "zigzag")
GROWTH_FACTOR = 4.0  # as tests/test_ring.py: error growth allowed from 1 to 8 devices

FULL = list(itertools.product(GRIDS, LAYOUTS, (True, False), (True, False), (1, 2, 4)))
# The default run: every grid with U > 1, every layout, mask kind and GQA ratio (MQA included), and
# the exchange of size 1; the whole product runs with `make test-all`.
DEFAULT = [
    ((2, 1), "zigzag", True, True, 1),
    ((2, 2), "striped", True, True, 2),
    ((2, 4), "zigzag", True, False, 4),
    ((4, 1), "contiguous", False, True, 2),
    ((4, 2), "zigzag", True, True, 1),
    ((1, 2), "striped", True, True, 2),
]


def _id(case):
    (u, n), layout, causal, seg, kvh = case
    return f"u{u}-n{n}-{layout}-{'causal' if causal else 'full'}-{'seg' if seg else 'noseg'}-kv{kvh}"


CASES = [pytest.param(c, id=_id(c), marks=[] if c in DEFAULT else [pytest.mark.slow]) for c in FULL]


@pytest.mark.parametrize("case", CASES)
def test_matrix_float32(case):
    (u, n), layout, causal, seg, kvh = case
    check_ring(
        Problem(n=n, ulysses=u, shard=8, layout=layout, causal=causal, segments=seg, kv_heads=kvh),
        implementation="xla",
        block_sizes=BS,
    )


@pytest.mark.slow
@pytest.mark.parametrize("u,n,layout", [(2, 2, "zigzag"), (4, 2, "striped")])
def test_bfloat16(u, n, layout):
    check_ring(
        Problem(
            n=n, ulysses=u, shard=8, layout=layout, causal=True, segments=True, kv_heads=2, dtype="bfloat16"
        ),
        implementation="xla",
        block_sizes=BS,
    )


@pytest.mark.parametrize(
    "heads,kv_heads,u,n", [(12, 6, 4, 2), pytest.param(8, 1, 4, 1, marks=pytest.mark.slow)]
)
def test_kv_heads_repeated_just_enough(heads, kv_heads, u, n):
    # MQA and kv heads that the Ulysses size does not divide (6 over 4: each copied twice).
    check_ring(
        Problem(
            n=n,
            ulysses=u,
            shard=8,
            layout="zigzag",
            causal=True,
            segments=True,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=8,
        ),
        implementation="xla",
        block_sizes=BS,
    )


def test_kv_repeats():
    assert ulysses.kv_repeats(8, 8, 4) == 1
    assert ulysses.kv_repeats(8, 1, 4) == 4
    assert ulysses.kv_repeats(8, 2, 4) == 2
    assert ulysses.kv_repeats(12, 6, 4) == 2
    with pytest.raises(ValueError, match="heads 6 .* size 4"):
        ulysses.kv_repeats(6, 2, 4)


@pytest.mark.parametrize("u,n", [(2, 4), pytest.param(4, 2, marks=pytest.mark.slow)])
def test_error_does_not_grow_with_device_count(u, n):
    # One global problem (L = 64) on 1 device and on 8 as Ulysses u x ring n.
    errs = {}
    for uu, nn in ((1, 1), (u, n)):
        pb = Problem(n=nn, ulysses=uu, shard=64 // (uu * nn), layout="striped", causal=True, segments=True)
        errs[(uu, nn)] = max(check_ring(pb, implementation="xla", block_sizes=BlockSizes(2, 2)))
    assert errs[(u, n)] <= GROWTH_FACTOR * max(errs[(1, 1)], F32_RTOL / 100), errs


def test_pallas_gpu_interpret():
    from ringattention.kernels.triton import pallas_gpu as pg

    bs = pg.BlockSizes(
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
    )
    check_ring(
        Problem(n=2, ulysses=2, shard=16, layout="zigzag", causal=True, segments=True, kv_heads=1),
        implementation="pallas_gpu",
        interpret=True,
        block_sizes=bs,
    )


@pytest.mark.slow
def test_pallas_tpu_interpret():
    from ringattention.kernels.tpu.blocks import BlockSizes as TpuBlockSizes

    check_ring(
        Problem(
            n=2,
            ulysses=2,
            shard=64,
            batch=1,
            head_dim=128,
            layout="striped",
            causal=True,
            segments=True,
            kv_heads=2,
        ),
        implementation="pallas_tpu",
        interpret=True,
        block_sizes=TpuBlockSizes(128, 128, 128, 128),
    )


# ---- sharded_attention and bad input -----------------------------------------------------------


def _global_problem(rng, L=32, H=4, K=2):
    q = rng.standard_normal((2, L, H, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, L, K, 8)).astype(np.float32) for _ in range(2))
    seg = np.repeat(np.array([[0, 1, 1, 2]]), L // 4, axis=1).repeat(2, 0).astype(np.int32)
    return q, k, v, seg


@pytest.mark.parametrize(
    "shape,axes,kw",
    [
        ((2, 1, 2), ("tp", "sp", "usp"), dict(head_axis="tp", layout="zigzag")),
        pytest.param(
            (2, 2, 2), ("dp", "sp", "usp"), dict(batch_axis="dp", layout="striped"), marks=pytest.mark.slow
        ),
        pytest.param(
            (2, 2, 2), ("tp", "sp", "usp"), dict(head_axis="tp", layout="contiguous"), marks=pytest.mark.slow
        ),
    ],
)
def test_sharded_attention_on_global_arrays(shape, axes, kw):
    # heads over tp, then the local heads exchanged over usp (kv heads 2 / tp 2 = 1: repeated)
    mesh = Mesh(np.array(jax.devices()[: np.prod(shape)]).reshape(shape), axes)
    q, k, v, seg = _global_problem(np.random.default_rng(4), H=8, K=2)
    out = ringattention.sharded_attention(
        q,
        k,
        v,
        mesh,
        seq_axis="sp",
        ulysses_axis="usp",
        segment_ids=seg,
        causal=True,
        implementation="xla",
        block_sizes=BlockSizes(8, 8),
        **kw,
    )
    want = reference64(q, k, v, np.zeros_like(q), causal=True, seg=seg)[0]
    assert rel_err(out, want) <= F32_RTOL


def _mesh(u=2, n=2):
    return Mesh(np.array(jax.devices()[: u * n]).reshape(n, u), ("sp", "usp"))


@pytest.mark.parametrize(
    "shape,kw,match",
    [
        ((1, 16, 6, 8), {}, "query heads 6 are not divisible by the Ulysses axis size 4"),
        ((1, 16, 4, 8), dict(ulysses_axis="nope"), "ulysses_axis='nope'"),
        ((1, 16, 4, 8), dict(ulysses_axis="sp"), "must differ"),
    ],
)
def test_ring_attention_bad_input(shape, kw, match):
    q = jnp.ones(shape, jnp.float32)
    k = jnp.ones(shape[:2] + (2, shape[3]), jnp.float32)
    spec = P(None, ("sp", "usp"))
    f = lambda q, k: ringattention.ring_attention(q, k, k, "sp", **{"ulysses_axis": "usp", **kw})
    with pytest.raises(ValueError, match=match):
        jax.shard_map(f, mesh=_mesh(u=4, n=1), in_specs=(spec, spec), out_specs=spec)(q, k)


@pytest.mark.parametrize(
    "L,H,kw,match",
    [
        (16, 3, {}, r"heads q.shape\[2\]=3 .* ulysses_axis usp=2"),
        (18, 4, {}, r"q.shape\[1\]=18 .* sp=2 x usp=2"),
        (16, 4, dict(ulysses_axis="usq"), "ulysses_axis='usq' is not an axis"),
        (16, 4, dict(ulysses_axis="sp"), "must differ"),
    ],
)
def test_sharded_attention_bad_input(L, H, kw, match):
    q = jnp.ones((1, L, H, 8), jnp.float32)
    k = jnp.ones((1, L, 2, 8), jnp.float32)
    with pytest.raises(ValueError, match=match):
        ringattention.sharded_attention(q, k, k, _mesh(), **{"ulysses_axis": "usp", **kw})
