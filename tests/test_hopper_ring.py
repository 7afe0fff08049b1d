"""The Pallas Mosaic GPU (Hopper) step through ``ring_attention`` against the float64 global reference
(``ringcheck.check_ring``), in Mosaic GPU's interpret mode on CPU (hopper_cases.py), which simulates
one GPU: rings of one device. The default backward and (slow) the two-kernel and the fused ones,
head dim 256, and sliding windows for the backwards of wider heads.
"""

import pytest
from hopper_cases import needs_interpret
from ringcheck import Problem, check_ring

from ringattention.kernels.hopper import pallas_hopper as ph


@needs_interpret
@pytest.mark.parametrize(
    "backward",
    [
        "default",
        pytest.param("mosaic", marks=pytest.mark.slow),
        pytest.param("fused", marks=pytest.mark.slow),
    ],
)
def test_ring_on_one_device(backward):
    """The float64 global reference through ring_attention: the default backward at head dim 32
    (one dq tile per CTA, the alternating kernel), and (slow) the two-kernel one and the fused one
    with the dataclass's tiles."""
    bs = None if backward == "default" else ph.BlockSizes(backward=backward)
    check_ring(
        Problem(
            n=1,
            layout="zigzag",
            causal=True,
            segments=True,
            batch=1,
            shard=96,
            heads=4,
            kv_heads=2,
            head_dim=32,
            dtype="bfloat16",
        ),
        implementation="pallas_hopper",
        interpret=True,
        block_sizes=bs,
    )


@pytest.mark.slow
@needs_interpret
def test_ring_on_one_device_head_dim_256():
    check_ring(
        Problem(
            n=1,
            layout="zigzag",
            causal=True,
            segments=True,
            batch=1,
            shard=96,
            heads=2,
            kv_heads=1,
            head_dim=256,
            dtype="bfloat16",
        ),
        implementation="pallas_hopper",
        interpret=True,
    )


@pytest.mark.slow
@needs_interpret
@pytest.mark.parametrize(
    "dim, bs",
    [(256, None), (128, ph.BlockSizes(backward="fused")), (64, ph.BlockSizes(backward="fused"))],
    ids=["split", "cta", "cta64"],
)
def test_ring_on_one_device_with_window_wide_heads(dim, bs):
    """The float64 global reference through ring_attention(sliding_window=...) for the backwards
    of wider heads (the head-dim-split default at 256, the fused backward at 128 and 64)."""
    check_ring(
        Problem(
            n=1,
            layout="zigzag",
            causal=True,
            segments=True,
            batch=1,
            shard=192,
            heads=2,
            kv_heads=1,
            head_dim=dim,
            dtype="bfloat16",
            window=100,
        ),
        implementation="pallas_hopper",
        interpret=True,
        block_sizes=bs,
    )
