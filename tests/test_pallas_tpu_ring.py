"""Pallas TPU ring step (``implementation="pallas_tpu"``) in interpret mode on CPU, ring-level:
``check_ring`` against the float64 reference (forward and gradients) with Pallas' generic
interpreter, a covering subset by default and the full product under ``slow``; sliding windows, the
optional step features, the default block sizes. What the pallas_tpu tests share: tpu_cases.py.
"""

from __future__ import annotations

import itertools

import pytest
from ringcheck import Problem, check_ring
from tpu_cases import SMALL


def ring(pb: Problem, block_sizes=SMALL):
    return check_ring(pb, implementation="pallas_tpu", interpret=True, block_sizes=block_sizes)


# (n, layout, causal, segments, kv_heads, dtype, shard, head_dim): every ring size, layout, mask
# kind, GQA ratio and dtype appears; shard 256 with 128 blocks mixes SKIP/PARTIAL/FULL in a step.
COVER = [
    (1, "contiguous", True, False, 2, "float32", 256, 128),
    (2, "zigzag", True, True, 1, "float32", 128, 128),
    (3, "striped", False, False, 4, "bfloat16", 128, 128),
    (4, "zigzag", True, False, 2, "bfloat16", 256, 128),
    (4, "contiguous", False, True, 4, "float32", 128, 128),
    (8, "striped", True, True, 1, "float32", 128, 128),
    (8, "contiguous", True, False, 2, "bfloat16", 128, 128),
    (2, "striped", True, True, 2, "float32", 256, 64),  # head_dim 64: the [B, H, S, D] view
]


@pytest.mark.parametrize("n,layout,causal,segments,kv_heads,dtype,shard,head_dim", COVER)
def test_ring_cover(n, layout, causal, segments, kv_heads, dtype, shard, head_dim):
    ring(
        Problem(
            n=n,
            layout=layout,
            causal=causal,
            segments=segments,
            batch=1,
            shard=shard,
            heads=4,
            kv_heads=kv_heads,
            head_dim=head_dim,
            dtype=dtype,
        )
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "n,layout,causal,segments,kv_heads,dtype",
    list(
        itertools.product(
            (1, 2, 3, 4, 8),
            ("contiguous", "striped", "zigzag"),
            (True, False),
            (False, True),
            (1, 2, 4),
            ("float32", "bfloat16"),
        )
    ),
)
def test_ring_full(n, layout, causal, segments, kv_heads, dtype):
    ring(
        Problem(
            n=n,
            layout=layout,
            causal=causal,
            segments=segments,
            batch=2,
            shard=256,
            heads=4,
            kv_heads=kv_heads,
            head_dim=128,
            dtype=dtype,
        )
    )


WINDOW_COVER = [  # (n, layout, causal, segments, kv_heads, dtype, window), shard 256, head dim 128
    pytest.param(
        4,
        "contiguous",
        True,
        False,
        2,
        "float32",
        200,  # one hop; edge blocks
        marks=pytest.mark.slow,
    ),
    pytest.param(3, "zigzag", False, True, 1, "bfloat16", 300, marks=pytest.mark.slow),
    pytest.param(2, "striped", True, True, 4, "float32", 90, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("n,layout,causal,segments,kv_heads,dtype,window", WINDOW_COVER)
def test_ring_with_window(n, layout, causal, segments, kv_heads, dtype, window):
    ring(
        Problem(
            n=n,
            layout=layout,
            causal=causal,
            segments=segments,
            batch=1,
            shard=256,
            heads=4,
            kv_heads=kv_heads,
            head_dim=128,
            dtype=dtype,
            window=window,
        )
    )


# (n, layout, segments, kv_heads, head_dim, v_head_dim, softcap, prefix, bidirectional, sinks), all
# causal (prefix and bidirectional segments relax it), float32, batch 2 (a row without a prefix)
FEATURE_RING = [
    (1, "contiguous", False, 2, 128, None, 2.0, True, False, False),
    (2, "zigzag", True, 1, 128, None, 2.0, False, True, True),  # sinks merged around the kernel
    (4, "striped", False, 2, 192, 128, None, True, False, False),  # MLA head dims
    (3, "zigzag", True, 2, 192, 128, 2.0, True, True, False),  # everything together
]


@pytest.mark.parametrize(
    "n,layout,segments,kv_heads,head_dim,v_head_dim,softcap,prefix,bidir,sinks", FEATURE_RING
)
def test_ring_optional_features(
    n, layout, segments, kv_heads, head_dim, v_head_dim, softcap, prefix, bidir, sinks
):
    ring(
        Problem(
            n=n,
            layout=layout,
            causal=True,
            segments=segments,
            batch=2,
            shard=128,
            heads=4,
            kv_heads=kv_heads,
            head_dim=head_dim,
            v_head_dim=v_head_dim,
            softcap=softcap,
            prefix=prefix,
            bidirectional=bidir,
            sinks=sinks,
        )
    )


def test_ring_default_block_sizes():
    ring(Problem(n=2, layout="zigzag", shard=384, head_dim=128, batch=1), block_sizes=None)
