"""Remat policies that keep ring attention's output and lse (``ringattention.remat``).

"save_attn" / "offload_attn" must (1) run ring attention's forward lap once per layer in a
differentiated step, where "full" runs it twice (counted as collective-permutes of the ring and as
Mosaic GPU kernel calls in the step lowered for CUDA), (2) give the loss and gradients of
``remat="none"``, (3) ask for host memory when offloading.
"""

from __future__ import annotations

import dataclasses
import os
import re
from unittest import mock

import jax
import jax.numpy as jnp
import pytest
from test_model import GRAD_RTOL, LOSS_RTOL, assert_trees_close, packed_batch, rel_err, to_ring

from models import llama
from models.sharding import MeshConfig, make_mesh
from ringattention import implementations
from ringattention import remat as ra_remat

SEQ = 256


def _step(config, mesh=None):
    return jax.jit(jax.grad(lambda p, b: llama.loss_fn(config, p, b, mesh=mesh)[0]))


def _batch_shapes(seq: int = SEQ):
    ids = jax.ShapeDtypeStruct((1, seq), jnp.int32)
    return {"input_ids": ids, "targets": ids}


def _collective_permutes(config, mesh) -> int:
    text = _step(config, mesh).trace(llama.abstract_params(config), _batch_shapes()).lower().as_text()
    return len(re.findall(r"stablehlo\.collective_permute", text))


@pytest.mark.parametrize("scan_layers", [True, False])
def test_saved_attention_runs_one_forward_lap_per_layer_on_a_ring(scan_layers):
    """Ring of 2: ring attention's ppermutes in the differentiated step. The forward lap sends k/v
    (f per layer, from the forward alone); "none" and "save_attn" add the backward lap only."""
    mesh = make_mesh(MeshConfig(sp=2), jax.devices()[:2])
    base = llama.get_config("debug", num_layers=2, layout="zigzag", scan_layers=scan_layers, loss_chunk=None)
    forward_only = jax.jit(lambda p, b: llama.loss_fn(base, p, b, mesh=mesh)[0])
    text = forward_only.trace(llama.abstract_params(base), _batch_shapes()).lower().as_text()
    f = len(re.findall(r"stablehlo\.collective_permute", text))
    counts = {
        r: _collective_permutes(dataclasses.replace(base, remat=r), mesh)
        for r in ("none", "full", "save_attn", "offload_attn")
    }
    assert f > 0
    assert counts["save_attn"] == counts["offload_attn"] == counts["none"], counts
    assert counts["full"] == counts["none"] + f, counts  # full re-runs every forward lap


def _mosaic_kernel_calls(config) -> int:
    """Mosaic GPU custom calls in the training step lowered for CUDA (no GPU needed)."""
    with mock.patch.object(implementations, "platform", lambda mesh=None: "gpu"):  # lower as if on a GPU
        shapes = llama.abstract_params(config)
        lowered = _step(config).trace(shapes, _batch_shapes()).lower(lowering_platforms=("cuda",))
    return lowered.as_text().count("stablehlo.custom_call @mosaic_gpu")


@pytest.fixture(scope="module")
def hopper_config():
    return llama.get_config(
        "debug",
        attention="pallas_hopper",
        num_layers=2,
        hidden_size=128,
        num_heads=2,
        num_kv_heads=1,
        head_dim=64,
        dtype="bfloat16",
    )


def test_saved_attention_calls_the_forward_kernel_once_per_layer(hopper_config):
    """Ring of one, pallas_hopper lowered for CUDA, layers scanned: the scan body holds one forward
    kernel and the one-kernel fused backward (head dim 64's default); "full" holds a second
    forward kernel."""
    calls = {
        r: _mosaic_kernel_calls(dataclasses.replace(hopper_config, remat=r))
        for r in ("none", "full", "save_attn")
    }
    assert calls == {"none": 2, "full": 3, "save_attn": 2}


def test_offload_asks_for_pinned_host_memory(hopper_config):
    config = dataclasses.replace(hopper_config, remat="offload_attn")
    with mock.patch.object(implementations, "platform", lambda mesh=None: "gpu"):
        shapes = llama.abstract_params(config)
        text = _step(config).trace(shapes, _batch_shapes()).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("stablehlo.custom_call @mosaic_gpu") == 2  # as save_attn above
    assert "pinned_host" in text and "annotate_device_placement" in text


@pytest.mark.parametrize(
    "remat,scan_layers,sp", [("save_attn", True, 2), ("offload_attn", False, 1)], ids=str
)
def test_saved_attention_matches_no_remat(remat, scan_layers, sp):
    """Loss and gradients equal remat="none" (float32, packed documents, zigzag ring)."""
    config = llama.get_config("debug", loss_chunk=None, layout="zigzag", scan_layers=scan_layers)
    params = jax.tree.map(lambda x: x * 4, llama.init_params(config, jax.random.key(1)))
    mesh = make_mesh(MeshConfig(sp=sp), jax.devices()[:sp])
    batch = to_ring(packed_batch(3), "zigzag", sp)
    results = []
    for r in ("none", remat):
        cfg = dataclasses.replace(config, remat=r)
        fn = lambda p, c=cfg: llama.loss_fn(c, p, batch, mesh=mesh)  # noqa: E731
        results.append(jax.jit(jax.value_and_grad(fn, has_aux=True))(params))
    (loss, _), grads = results[1]
    (ref_loss, _), ref_grads = results[0]
    assert rel_err(loss, ref_loss) < LOSS_RTOL
    assert_trees_close(grads, ref_grads, GRAD_RTOL)


def test_allow_host_offload_sets_the_pool_once(monkeypatch):
    monkeypatch.delenv(ra_remat.HOST_LIMIT_ENV, raising=False)
    ram_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    gb = ra_remat.allow_host_offload(0.5)
    assert gb == max(1, int(ram_gb * 0.5)) and os.environ[ra_remat.HOST_LIMIT_ENV] == str(gb)
    monkeypatch.setenv(ra_remat.HOST_LIMIT_ENV, "100")
    assert ra_remat.allow_host_offload() == 100  # a value the user set is kept
    with pytest.raises(ValueError, match="fraction=0"):
        ra_remat.allow_host_offload(0)
