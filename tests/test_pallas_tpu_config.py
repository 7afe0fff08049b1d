"""Pallas TPU ring step (``implementation="pallas_tpu"``), pure JAX: the blocks it fetches, the
default block sizes per chip and per shard, and the checks of its inputs (the optional features'
included) and of a ring's shards.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ringattention import masks, ring_attention
from ringattention.kernels.tpu import pallas_tpu
from ringattention.kernels.tpu.blocks import BlockSizes, fetch_index, pick_block


def test_step_feature_arguments_are_checked():
    q, k, v, qp, kp, _, _ = _args()
    kw = dict(softmax_scale=1.0, interpret=True)
    seg, pre = jnp.zeros((1, 256), jnp.int32), jnp.zeros((1,), jnp.int32)
    with pytest.raises(ValueError, match="needs causal=True"):
        pallas_tpu.forward_step(q, k, v, qp, kp, None, None, causal=False, prefix=pre, **kw)
    with pytest.raises(ValueError, match=r"prefix must be int32 \[B\]"):
        pallas_tpu.forward_step(q, k, v, qp, kp, None, None, causal=True, prefix=pre[:0], **kw)
    with pytest.raises(ValueError, match="segment ids"):
        pallas_tpu.forward_step(q, k, v, qp, kp, None, None, causal=True, bidirectional=True, **kw)
    with pytest.raises(ValueError, match="softcap"):
        pallas_tpu.forward_step(q, k, v, qp, kp, seg, seg, causal=True, softcap=0.0, **kw)
    with pytest.raises(ValueError, match="Dv"):
        pallas_tpu.forward_step(q, k, v[:, :128], qp, kp, None, None, causal=True, **kw)


def test_fetch_index_points_at_computed_blocks():
    kind = jnp.asarray(np.random.default_rng(0).integers(0, 3, (2, 5, 7)), jnp.int32)
    kind = kind.at[0, 1].set(masks.SKIP)  # a row with nothing to compute
    fetch, kind = np.asarray(fetch_index(kind)), np.asarray(kind)
    live = kind != masks.SKIP
    j = np.broadcast_to(np.arange(kind.shape[-1]), kind.shape)
    assert np.all(fetch[live] == j[live])
    has_live = live.any(-1, keepdims=True) & ~live
    picked = np.take_along_axis(live, fetch, axis=-1)
    assert np.all(picked[np.broadcast_to(has_live, kind.shape)])
    assert np.all((fetch >= 0) & (fetch < kind.shape[-1]))


@pytest.mark.parametrize(
    "kind", ["TPU v4", "TPU v5 lite", "TPU v5p", "TPU v6 lite", "TPU7x", "cpu", "unknown"]
)
def test_for_chip_defaults_are_tpu_aligned(kind):
    bs = BlockSizes.for_chip(kind)
    assert all(getattr(bs, f) % 128 == 0 for f in ("block_q", "block_kv", "block_q_bwd", "block_kv_bwd"))


@pytest.mark.parametrize("length,wanted", [(384, 512), (640, 512), (1024, 256)])
def test_default_blocks_divide_the_shard(length, wanted):
    block = pick_block(length, wanted, "block_q", explicit=False)
    assert length % block == 0 and block % 128 == 0 and block <= wanted


def _args(S=256, D=128, dtype=jnp.float32):
    q = jnp.zeros((1, S, 2, D), dtype)
    k = jnp.zeros((1, S, 1, D), dtype)
    pos = jnp.arange(S, dtype=jnp.int32)
    return q, k, k, pos, pos, None, None


def test_bad_inputs_raise():
    kw = dict(causal=True, softmax_scale=1.0, interpret=True)
    with pytest.raises(ValueError, match="block_q=100"):
        BlockSizes(block_q=100)
    with pytest.raises(ValueError, match="length=200"):
        pallas_tpu.forward_step(*_args(S=200), **kw)
    with pytest.raises(ValueError, match="block_q=256"):
        pallas_tpu.forward_step(*_args(S=384), block_sizes=BlockSizes(256, 128), **kw)
    q, k, v, qp, kp, _, _ = _args()
    with pytest.raises(TypeError, match="dtype"):
        pallas_tpu.forward_step(q, k.astype(jnp.bfloat16), v, qp, kp, None, None, **kw)
    with pytest.raises(ValueError, match="q_pos.shape"):
        pallas_tpu.forward_step(q, k, v, qp[:128], kp, None, None, **kw)
    with pytest.raises(ValueError, match="q_seg and k_seg"):
        pallas_tpu.forward_step(q, k, v, qp, kp, jnp.zeros((1, 256), jnp.int32), None, **kw)
    with pytest.raises(TypeError, match="block_sizes"):
        pallas_tpu.forward_step(q, k, v, qp, kp, None, None, block_sizes=(128, 128), **kw)


def test_ring_rejects_short_shards():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("sp",))
    P = jax.sharding.PartitionSpec
    x = jnp.zeros((1, 64, 2, 128), jnp.float32)
    f = lambda q: ring_attention(q, q, q, "sp", causal=True, implementation="pallas_tpu", interpret=True)
    with pytest.raises(ValueError, match="multiples of 128"):
        jax.shard_map(f, mesh=mesh, in_specs=P(None, "sp"), out_specs=P(None, "sp"), check_vma=False)(x)
