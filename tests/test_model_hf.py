"""Parity of models.llama with transformers.LlamaForCausalLM (torch, CPU) on tiny random
checkpoints.
"""

from __future__ import annotations

import itertools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import llama
from models.hf import config_from_hf
from models.sharding import MeshConfig, make_mesh

torch = pytest.importorskip("torch", reason="HF parity tests need torch (CPU)")
transformers = pytest.importorskip("transformers", reason="HF parity tests need transformers")

LOGITS_RTOL = 1e-4  # relative Frobenius error of float32 logits vs transformers
BATCH, SEQ = 2, 32
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}  # small, so the test positions get scaled


def rel_err(x, ref) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(x)), "non-finite values"
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def mesh_of(mesh_config: MeshConfig | None):
    """A mesh over the first dp*fsdp*tp*sp*usp of the 8 CPU devices."""
    if mesh_config is None:
        return None
    n = mesh_config.dp * mesh_config.fsdp * mesh_config.tp * mesh_config.sp * mesh_config.usp
    return make_mesh(mesh_config, jax.devices()[:n])


def _hf_config(tied: bool):
    kw = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
        initializer_range=0.1,
        max_position_embeddings=256,
    )
    if int(transformers.__version__.split(".")[0]) >= 5:
        kw["rope_parameters"] = {**LLAMA3, "rope_theta": 500.0}
    else:
        kw.update(rope_theta=500.0, rope_scaling=dict(LLAMA3))
    return transformers.LlamaConfig(**kw)


def _hf_model(tied: bool, seed: int):
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(_hf_config(tied)).eval()
    with torch.no_grad():  # norms away from 1 so that a mix-up of them shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
    return model


def hf_logits(model, ids, positions=None) -> np.ndarray:
    with torch.no_grad():
        kw = {} if positions is None else {"position_ids": torch.as_tensor(np.asarray(positions))}
        return model(torch.as_tensor(np.asarray(ids)), **kw).logits.float().numpy()


@pytest.fixture(scope="module", params=["untied", "tied"])
def checkpoint(request, tmp_path_factory):
    """(model dir, torch model, input ids, torch logits) for a tiny GQA llama3-scaled checkpoint."""
    tied = request.param == "tied"
    model = _hf_model(tied, seed=1 + tied)
    path = str(tmp_path_factory.mktemp(request.param))
    model.save_pretrained(path)
    ids = np.random.default_rng(0).integers(0, 256, (BATCH, SEQ))
    return path, model, ids, hf_logits(model, ids)


MESHES = [  # (mesh, layout): sp in {2, 4}, with tp, fsdp and Ulysses (usp) variants, every layout
    (MeshConfig(sp=2), "contiguous"),
    (MeshConfig(tp=2, sp=4), "zigzag"),
    (MeshConfig(fsdp=2, sp=4), "striped"),
    (MeshConfig(fsdp=2, tp=2, sp=2), "zigzag"),
    (MeshConfig(tp=2, sp=2, usp=2), "striped"),  # one head per device, kv heads repeated
]


def test_load_hf_parity_single_device(checkpoint):
    path, _, ids, ref = checkpoint
    config, params = llama.load_hf(path)
    assert config.rope_scaling is not None and config.num_kv_heads < config.num_heads
    assert rel_err(llama.forward(config, params, ids), ref) < LOGITS_RTOL


@pytest.mark.parametrize("mesh_config,layout", MESHES, ids=lambda x: str(x))
def test_load_hf_parity_ring(checkpoint, mesh_config, layout):
    path, _, ids, ref = checkpoint
    config, params = llama.load_hf(path, layout=layout)
    mesh = mesh_of(mesh_config)
    params = jax.device_put(params, llama.param_shardings(config, mesh))
    assert rel_err(llama.forward(config, params, ids, mesh=mesh), ref) < LOGITS_RTOL


@pytest.mark.slow
@pytest.mark.parametrize(
    "sp,extra,layout",
    list(itertools.product([1, 2, 4], ["none", "tp", "fsdp"], ["contiguous", "striped", "zigzag"])),
)
def test_load_hf_parity_sweep(checkpoint, sp, extra, layout):
    path, _, ids, ref = checkpoint
    config, params = llama.load_hf(path, layout=layout)
    mesh = mesh_of(MeshConfig(sp=sp, tp=2 if extra == "tp" else 1, fsdp=2 if extra == "fsdp" else 1))
    assert rel_err(llama.forward(config, params, ids, mesh=mesh), ref) < LOGITS_RTOL


@pytest.mark.slow
@pytest.mark.parametrize(
    "usp,sp,layout", list(itertools.product([2, 4], [1, 2, 4], ["contiguous", "striped", "zigzag"]))
)
def test_load_hf_parity_ulysses_sweep(checkpoint, usp, sp, layout):
    if usp * sp > 8:
        pytest.skip("more than 8 devices")
    path, _, ids, ref = checkpoint
    config, params = llama.load_hf(path, layout=layout)
    mesh = mesh_of(MeshConfig(sp=sp, usp=usp))
    assert rel_err(llama.forward(config, params, ids, mesh=mesh), ref) < LOGITS_RTOL


def _packed(lengths):
    """input ids, per-document positions and segment ids for one packed row of documents."""
    rng = np.random.default_rng(sum(lengths))
    ids = rng.integers(0, 256, (1, sum(lengths)))
    pos = np.concatenate([np.arange(n) for n in lengths])[None]
    seg = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)])[None]
    return ids, pos, seg


@pytest.mark.parametrize(
    "mesh_config,layout",
    [
        (None, "contiguous"),
        (MeshConfig(sp=4, dp=2), "zigzag"),
        pytest.param(MeshConfig(sp=2, usp=2, dp=2), "zigzag", marks=pytest.mark.slow),
    ],
)
def test_packed_documents_match_separate_runs(checkpoint, mesh_config, layout):
    path, model, _, _ = checkpoint
    config, params = llama.load_hf(path, layout=layout)
    lengths = [[13, 19], [24, 8]]  # two rows of two documents each
    rows = [_packed(n) for n in lengths]
    ids, pos, seg = (np.concatenate(x) for x in zip(*rows, strict=True))
    mesh = mesh_of(mesh_config)
    out = np.asarray(llama.forward(config, params, ids, positions=pos, segment_ids=seg, mesh=mesh))
    for b, ns in enumerate(lengths):
        start = 0
        for n in ns:
            ref = hf_logits(model, ids[b : b + 1, start : start + n])[0]
            assert rel_err(out[b, start : start + n], ref) < LOGITS_RTOL
            start += n


def test_save_hf_loads_in_transformers(tmp_path):
    config = llama.get_config(
        "debug",
        tie_embeddings=False,
        rope_scaling=llama.RopeScaling(**{k: v for k, v in LLAMA3.items() if k != "rope_type"}),
    )
    params = llama.init_params(config, jax.random.key(3))
    params = jax.tree.map(lambda x: x * 3, params)  # away from near-uniform logits
    llama.save_hf(config, params, str(tmp_path / "one"))
    model = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path / "one")).eval()
    ids = np.random.default_rng(1).integers(0, 256, (BATCH, SEQ))
    assert rel_err(llama.forward(config, params, ids), hf_logits(model, ids)) < LOGITS_RTOL
    # a sharded checkpoint with an index reads back into the same parameters
    llama.save_hf(config, params, str(tmp_path / "sharded"), max_shard_bytes=40_000)
    assert os.path.exists(tmp_path / "sharded" / "model.safetensors.index.json")
    config2, params2 = llama.load_hf(str(tmp_path / "sharded"), loss_chunk=config.loss_chunk)
    assert config2 == config
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)
    # bfloat16 checkpoints (what released LLaMA weights are) read back to the rounded values
    llama.save_hf(config, params, str(tmp_path / "bf16"), dtype="bfloat16")
    _, params3 = llama.load_hf(str(tmp_path / "bf16"))
    rounded = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), params)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), rounded, params3)
    bf16_model = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path / "bf16"))
    assert bf16_model.dtype == torch.bfloat16


def test_config_json_transformers_4_and_5(checkpoint):
    path = checkpoint[0]
    with open(os.path.join(path, "config.json")) as f:
        hf = json.load(f)
    rope = hf.pop("rope_parameters", None) or {**hf.pop("rope_scaling"), "rope_theta": hf.pop("rope_theta")}
    v5 = config_from_hf({**hf, "rope_parameters": rope})
    v4 = config_from_hf(
        {
            **hf,
            "rope_theta": rope["rope_theta"],
            "rope_scaling": {k: v for k, v in rope.items() if k != "rope_theta"},
        }
    )
    assert v4 == v5 and v5.rope_scaling.factor == LLAMA3["factor"]
    plain = config_from_hf({**hf, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}})
    assert plain.rope_scaling is None and plain.rope_theta == 1e4
    with pytest.raises(ValueError, match="rope scaling type"):
        config_from_hf({**hf, "rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}})
