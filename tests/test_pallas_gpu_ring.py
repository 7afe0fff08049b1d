"""The Pallas GPU (Triton) ring step through ``ring_attention`` in interpret mode: ``check_ring``
against the float64 reference (forward and gradients) over ring sizes, layouts, masks, GQA ratios and
dtypes (a covering subset by default, the full product under ``slow``), with sliding windows and
with the optional features. What the pallas_gpu tests share: pallas_gpu_cases.py.
"""

import itertools

import pytest
from pallas_gpu_cases import BS
from ringcheck import Problem, check_ring

RINGS = (1, 2, 3, 4, 8)
LAYOUTS = ("contiguous", "striped", "zigzag")
ALL_CASES = list(
    itertools.product(RINGS, LAYOUTS, (True, False), (False, True), (1, 2, 4), ("float32", "bfloat16"))
)
# A covering subset for the default run: every value of every axis, every ring size.
DEFAULT_CASES = [
    (1, "contiguous", True, False, 2, "float32"),
    (1, "zigzag", False, True, 4, "bfloat16"),
    (2, "striped", True, True, 1, "float32"),
    (2, "contiguous", False, False, 4, "bfloat16"),
    (3, "zigzag", True, False, 4, "float32"),
    (3, "striped", False, True, 2, "bfloat16"),
    (4, "contiguous", True, True, 4, "float32"),
    (4, "zigzag", True, True, 2, "bfloat16"),
    (8, "striped", True, True, 2, "float32"),
    (8, "contiguous", True, False, 1, "bfloat16"),
    (8, "zigzag", False, False, 2, "float32"),
]


def _id(case):
    n, layout, causal, seg, kvh, dtype = case
    return f"n{n}-{layout}-{'causal' if causal else 'full'}-{'seg' if seg else 'noseg'}-kv{kvh}-{dtype}"


def _ring_case(case):
    n, layout, causal, seg, kvh, dtype = case
    check_ring(
        Problem(n=n, layout=layout, causal=causal, segments=seg, kv_heads=kvh, dtype=dtype, shard=32),
        implementation="pallas_gpu",
        interpret=True,
        block_sizes=BS,
    )


@pytest.mark.parametrize("case", DEFAULT_CASES, ids=map(_id, DEFAULT_CASES))
def test_ring_matrix(case):
    _ring_case(case)


WINDOW_CASES = [  # (n, layout, causal, segments, kv_heads, dtype, window): shard 32
    (4, "contiguous", True, False, 1, "bfloat16", 24),  # a short lap of one hop
    pytest.param(2, "zigzag", True, True, 2, "float32", 20, marks=pytest.mark.slow),
    pytest.param(3, "striped", False, True, 4, "float32", 40, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("n,layout,causal,seg,kvh,dtype,window", WINDOW_CASES)
def test_ring_with_window(n, layout, causal, seg, kvh, dtype, window):
    check_ring(
        Problem(
            n=n,
            layout=layout,
            causal=causal,
            segments=seg,
            kv_heads=kvh,
            dtype=dtype,
            shard=32,
            window=window,
        ),
        implementation="pallas_gpu",
        interpret=True,
        block_sizes=BS,
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in ALL_CASES if c not in DEFAULT_CASES], ids=_id)
def test_ring_matrix_full(case):
    _ring_case(case)


# Rings with the optional features (ringcheck's Problem fields), each case a few seconds: the
# float64 reference of the whole sequence, through ring_attention's keywords to the kernels.
FEATURE_RINGS = [  # (n, layout, kv_heads, segments, features)
    (1, "contiguous", 2, True, dict(softcap=2.0, logit_scale=3.0, v_head_dim=8)),
    (2, "zigzag", 1, True, dict(prefix=True, batch=3, bidirectional=True)),
    (3, "striped", 2, False, dict(softcap=2.0, logit_scale=3.0, prefix=True, batch=3, sinks=True)),
    (4, "contiguous", 4, True, dict(bidirectional=True, v_head_dim=8, window=20)),
    (
        3,
        "zigzag",
        2,
        True,
        dict(
            softcap=2.0,
            logit_scale=3.0,
            prefix=True,
            bidirectional=True,
            sinks=True,
            v_head_dim=8,
            dtype="bfloat16",
        ),
    ),
]


@pytest.mark.parametrize(
    "n,layout,kvh,seg,features", FEATURE_RINGS, ids=lambda c: "-".join(c) if isinstance(c, dict) else str(c)
)
def test_ring_with_features(n, layout, kvh, seg, features):
    check_ring(
        Problem(n=n, layout=layout, kv_heads=kvh, segments=seg, shard=32, **features),
        implementation="pallas_gpu",
        interpret=True,
        block_sizes=BS,
    )
