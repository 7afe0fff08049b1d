"""Pallas TPU ring step (``implementation="pallas_tpu"``) for TPU from this CPU host: its kernels
lowered to Mosaic, and the optional step features' forward and backward (and a ring of them on a
v5e:2x2 mesh with ``"auto"``) compiled for a v5e chip by the TPU compiler (libtpu).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ringcheck import tpu_devices

from ringattention import ring_attention
from ringattention.kernels.tpu import pallas_tpu
from ringattention.kernels.tpu.blocks import BlockSizes


@pytest.mark.parametrize(
    "head_dim,dtype,causal,segments,window",
    [
        (128, jnp.bfloat16, True, True, None),
        (64, jnp.float32, False, False, None),
        (128, jnp.bfloat16, False, True, 300),
    ],
)
def test_lowers_to_mosaic_for_tpu(head_dim, dtype, causal, segments, window):
    # Exports for platform "tpu" from this CPU host: runs the Pallas -> Mosaic lowering (block-shape
    # tiling checks, every kernel op); Mosaic's own compile needs a TPU and is not covered.
    B, S, H, K = 1, 512, 4, 2
    arr = lambda *shape, dt=dtype: jax.ShapeDtypeStruct(shape, dt)
    q, kv, pos = arr(B, S, H, head_dim), arr(B, S, K, head_dim), arr(S, dt=jnp.int32)
    seg = arr(B, S, dt=jnp.int32) if segments else None
    rows = arr(B, H, S, dt=jnp.float32)
    kw = dict(causal=causal, softmax_scale=0.1, block_sizes=BlockSizes(256, 128, 128, 256), window=window)
    fwd = lambda q, k, v, qp, kp, qs, ks: pallas_tpu.forward_step(q, k, v, qp, kp, qs, ks, **kw)
    bwd = lambda *a: pallas_tpu.backward_step(*a, **kw)
    exported = [
        jax.export.export(jax.jit(fwd), platforms=["tpu"])(q, kv, kv, pos, pos, seg, seg),
        jax.export.export(jax.jit(bwd), platforms=["tpu"])(q, kv, kv, q, rows, rows, pos, pos, seg, seg),
    ]
    calls = sum(e.mlir_module().count("tpu_custom_call") for e in exported)
    assert calls == 3  # forward, dq, dk/dv kernels


@pytest.mark.parametrize("head_dim,v_head_dim,segments", [(192, 128, True), (128, 128, False)])
def test_optional_features_compile_for_tpu(head_dim, v_head_dim, segments):
    # The TPU compiler (libtpu, on this CPU host) compiles the forward and backward steps with
    # softcap + prefix (+ bidirectional segments) and MLA head dims through Mosaic for a v5e chip.
    sharding = jax.sharding.SingleDeviceSharding(tpu_devices()[0])
    B, S, H, K = 2, 512, 4, 2
    arr = lambda *shape, dt=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dt, sharding=sharding)  # noqa: E731
    q, k = arr(B, S, H, head_dim), arr(B, S, K, head_dim)
    v, do = arr(B, S, K, v_head_dim), arr(B, S, H, v_head_dim)
    pos, prefix, rows = arr(S, dt=jnp.int32), arr(B, dt=jnp.int32), arr(B, H, S, dt=jnp.float32)
    seg = arr(B, S, dt=jnp.int32) if segments else None
    kw = dict(
        causal=True,
        softmax_scale=0.1,
        block_sizes=BlockSizes(256, 128, 128, 256),
        softcap=30.0,
        bidirectional=segments,
    )
    fwd = lambda q, k, v, qp, kp, qs, ks, pre: pallas_tpu.forward_step(  # noqa: E731
        q, k, v, qp, kp, qs, ks, prefix=pre, **kw
    )
    bwd = lambda *a, pre: pallas_tpu.backward_step(*a, prefix=pre, **kw)  # noqa: E731
    f = jax.jit(fwd).trace(q, k, v, pos, pos, seg, seg, prefix).lower().compile()
    g = jax.jit(bwd).trace(q, k, v, do, rows, rows, pos, pos, seg, seg, pre=prefix).lower().compile()
    assert [o.shape for o in f.out_info] == [(B, S, H, v_head_dim), (B, H, S)]
    assert [o.shape for o in g.out_info] == [q.shape, k.shape, v.shape]
    assert sum(c.as_text().count('custom_call_target="tpu_custom_call"') for c in (f, g)) == 3


def test_ring_with_features_compiles_for_a_tpu_mesh_with_auto():
    # "auto" on a v5e:2x2 mesh keeps the Mosaic kernel when the call uses the optional features
    # (soft cap, a prefix per row, MLA head dims); the TPU compiler compiles forward and gradients.
    P = jax.sharding.PartitionSpec
    mesh = jax.sharding.Mesh(np.array(tpu_devices()).reshape(4), ("sp",))
    B, L, H, K = 2, 4 * 256, 4, 2
    sd = lambda *s, dt=jnp.bfloat16: jax.ShapeDtypeStruct(s, dt)  # noqa: E731
    q, k, v, prefix = sd(B, L, H, 192), sd(B, L, K, 192), sd(B, L, K, 128), sd(B, dt=jnp.int32)

    def local(q, k, v, prefix):
        return ring_attention(
            q, k, v, "sp", causal=True, layout="zigzag", logits_soft_cap=30.0, prefix_length=prefix
        )

    fn = jax.shard_map(local, mesh=mesh, in_specs=(P(None, "sp"),) * 3 + (P(),), out_specs=P(None, "sp"))
    loss = lambda q, k, v, pre: fn(q, k, v, pre).astype(jnp.float32).sum()  # noqa: E731
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, k, v, prefix).lower()
    assert grads.as_text().count("tpu_custom_call") >= 3  # forward, dq, dk/dv: not the XLA step
    compiled = grads.compile()
    assert [o.shape for o in compiled.out_info] == [q.shape, k.shape, v.shape]
