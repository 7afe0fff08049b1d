"""Gemma 2-shaped and DeepSeek (MLA)-shaped attention through the model, on CPU and lowered for an H200.

Gemma 2 (Gemma Team 2024): head dim 256 wider than hidden / heads, logit soft-capping, sliding and
full layers alternating. DeepSeek-V2/V3's multi-head latent attention (DeepSeek-AI 2024) attends
with q/k head dim 192 and v head dim 128 (``LlamaConfig.v_head_dim``; here with plain projections).
Tiny configs of each shape: a training step's loss and gradients through rings (every layout, with
Ulysses) equal the naive single-device model's; lowered for CUDA on an H200 mesh (no GPU: the mesh
device is mocked, as ``tests/test_contract.py`` does), "auto" runs the kernel registered with the
features the shape needs.
"""

from __future__ import annotations

import dataclasses
import functools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ringcheck import h200_devices
from test_model import (
    GRAD_RTOL,
    LOSS_RTOL,
    assert_trees_close,
    grads,
    packed_batch,
    rel_err,
    to_ring,
)

from models import flops, kvcache, llama
from models.config import LlamaConfig, num_params
from models.hf import save_hf
from models.modules import attention_needs
from models.sharding import MeshConfig, make_mesh
from ringattention import implementations

TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_layers=2,
    q_chunk=8,
    kv_chunk=8,
    loss_chunk=None,
    max_position_embeddings=256,
)
SHAPES = {
    # head dim 256 > hidden / heads; soft caps small enough to bend these logits (Gemma 2 9B: 50,
    # 30); layer 0 slides over 8 tokens (a quarter of the sequence), layer 1 sees them all
    "gemma2": LlamaConfig(
        **TINY,
        family="gemma2",
        num_heads=2,
        num_kv_heads=1,
        head_dim=256,
        query_pre_attn_scalar=256,
        attn_logit_softcap=0.2,
        final_logit_softcap=5.0,
        sliding_window=8,
        tie_embeddings=True,
        layer_types=("sliding_attention", "full_attention"),
    ),
    # q/k 192, v 128 per head, every head its own kv head (MLA's attention is multi-head)
    "mla": LlamaConfig(**TINY, num_heads=4, num_kv_heads=4, head_dim=192, v_head_dim=128),
}
NEEDS = {"gemma2": frozenset({"softcap"}), "mla": frozenset({"v_head_dim"})}  # the step features
PARAM_SCALE = 4  # weights x this, so that the attention's features change the logits visibly


@functools.cache
def _setup(name: str):
    """(config, params, reference gradients and aux of the naive single-device model)."""
    config = SHAPES[name]
    params = jax.tree.map(lambda x: x * PARAM_SCALE, llama.init_params(config, jax.random.key(1)))
    naive = dataclasses.replace(config, attention="reference")
    return config, params, grads(naive, params, packed_batch())


@pytest.mark.parametrize("name", list(SHAPES))
def test_params_and_flops_count_each_head_dim(name):
    config, params, _ = _setup(name)
    assert num_params(config) == sum(x.size for x in jax.tree.leaves(params))
    attn = params["layers"]["attn"]  # [layers, ...]
    D, Dv = config.head_dim, config.v_dim
    assert attn["wv"].shape[-1] == Dv and attn["wo"].shape[-2] == Dv and attn["wq"].shape[-1] == D
    # per visible pair and head: q.k over D, p.v over Dv, 3x for training; layer 0 of gemma2 slides
    seg = np.ones((1, 64), np.int32)
    pairs = [flops.document_pairs(64, window=config.layer_window(i)) for i in range(2)]
    attention = sum(6 * config.num_heads * (D + Dv) * int(p) for p in pairs)
    assert llama.batch_flops(config, seg) == 6 * flops.matmul_params(config) * 64 + attention
    assert attention_needs(config) == NEEDS[name]


@pytest.mark.parametrize("name", list(SHAPES))
def test_training_step_on_one_device_equals_the_naive_model(name):
    config, params, (ref, ref_aux) = _setup(name)
    got, aux = grads(dataclasses.replace(config, attention="xla"), params, packed_batch())
    assert rel_err(aux["loss"], ref_aux["loss"]) < LOSS_RTOL
    assert_trees_close(got, ref, GRAD_RTOL)
    # the shape's attention features change the loss here, so the parities above see them
    without = {
        "gemma2": [dict(attn_logit_softcap=None), dict(sliding_window=None, layer_types=None)],
        "mla": [],
    }[name]
    for change in without:
        other = dataclasses.replace(config, attention="reference", **change)
        loss = llama.loss_fn(other, params, packed_batch())[0]
        assert rel_err(loss, ref_aux["loss"]) > 100 * LOSS_RTOL, change


SP2, SP4, USP = MeshConfig(sp=2), MeshConfig(sp=4, fsdp=2), MeshConfig(sp=2, usp=2)
RING_CASES = [  # every shape through a plain ring by default; zigzag and Ulysses x ring split
    ("gemma2", SP2, "contiguous"),
    ("mla", SP4, "zigzag"),
    ("gemma2", USP, "striped"),
    pytest.param("mla", SP2, "contiguous", marks=pytest.mark.slow),
    pytest.param("gemma2", SP4, "zigzag", marks=pytest.mark.slow),
    pytest.param("mla", USP, "striped", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name,mesh_config,layout", RING_CASES, ids=str)
def test_training_step_through_rings_equals_one_device(name, mesh_config, layout):
    config, params, (ref, ref_aux) = _setup(name)
    mesh = make_mesh(mesh_config, jax.devices()[: _size(mesh_config)])
    ring_cfg = dataclasses.replace(config, attention="xla", layout=layout, loss_chunk=4)
    sharded = jax.device_put(params, llama.param_shardings(ring_cfg, mesh))
    got, aux = grads(ring_cfg, sharded, to_ring(packed_batch(), layout, mesh.shape["sp"]), mesh)
    assert rel_err(aux["loss"], ref_aux["loss"]) < LOSS_RTOL
    assert_trees_close(got, ref, GRAD_RTOL)


def _size(mesh_config: MeshConfig) -> int:
    return int(np.prod([getattr(mesh_config, a) for a in ("dp", "fsdp", "tp", "sp", "usp")]))


def test_decoding_hf_export_and_cudnn_refuse_mla_shapes(tmp_path):
    config = SHAPES["mla"]
    with pytest.raises(ValueError, match=r"v_head_dim=128 != head_dim=192"):
        kvcache.check_decodable(config)
    with pytest.raises(ValueError, match=r"v_head_dim=128 != head_dim=192"):
        save_hf(config, llama.abstract_params(config), str(tmp_path / "mla"))
    assert not (tmp_path / "mla").exists()  # refused before anything is written
    cudnn = dataclasses.replace(config, attention="cudnn")
    with pytest.raises(ValueError, match="attention='cudnn' cannot do v_head_dim"):
        llama.forward(cudnn, llama.init_params(config, jax.random.key(0)), np.zeros((1, 8), int))
    with pytest.raises(ValueError, match="v_head_dim"):
        llama.get_config("debug", v_head_dim=0)


# ---- compiled for H200s ----------------------------------------------------------------------------

SEQ_H200 = 512  # 256-token shards over sp=2


def _trace_on_h200(config: LlamaConfig):
    """(implementations whose steps the model's training step loads, the traced step) on a mesh
    of sp=2 deviceless H200s (``ringcheck.h200_devices``; the pick happens at trace time)."""
    cfg = dataclasses.replace(config, attention="auto", dtype="bfloat16")
    mesh = make_mesh(MeshConfig(sp=2), h200_devices(2))
    sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    ids = jax.ShapeDtypeStruct((1, SEQ_H200), jnp.int32, sharding=sh)
    step = jax.grad(lambda p, b: llama.loss_fn(cfg, p, b, mesh=mesh)[0])
    params = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        llama.abstract_params(cfg),
        llama.param_shardings(cfg, mesh),
    )
    loaded = set()
    load = implementations.Implementation.load

    def recorded(impl):
        loaded.add(impl.name)
        return load(impl)

    jax.clear_caches()  # a cached trace would load nothing
    with mock.patch.object(implementations.Implementation, "load", recorded):
        traced = jax.jit(step).trace(params, {"input_ids": ids, "targets": ids})
    return loaded, traced


def _featured(name: str):
    """The implementation registered with the features shape ``name`` needs that "auto" takes on
    an H200."""
    mesh = make_mesh(MeshConfig(sp=2), h200_devices(2))
    return implementations.resolve("auto", mesh, shard=SEQ_H200 // 2, needs=NEEDS[name])


@pytest.mark.parametrize("name", list(SHAPES))
def test_auto_on_an_h200_runs_the_kernel_with_the_features(name):
    want = _featured(name)
    assert NEEDS[name] <= want.features and want.name != "xla"  # a GPU kernel has them
    assert _trace_on_h200(SHAPES[name])[0] == {want.name}


KERNEL_CALLS = {"pallas_gpu": "xla.gpu.triton", "pallas_hopper": "@mosaic_gpu"}  # lowered text


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_h200_training_step_compiles(name):
    want = _featured(name).name
    lowered = _trace_on_h200(SHAPES[name])[1].lower()
    assert lowered.as_text().count(KERNEL_CALLS[want]) >= 2  # forward, and the backward's kernels
    assert lowered.compile().memory_analysis().temp_size_in_bytes > 0


@pytest.mark.parametrize("name", list(SHAPES))
def test_auto_on_an_h200_runs_pallas_hopper(name):
    """pallas_hopper has soft-capping, head dim 256 and a value head dim of its own (issue 59):
    "auto" runs both shapes on it, not on the Triton step."""
    assert _featured(name).name == "pallas_hopper"  # the trace runs it: the test above
