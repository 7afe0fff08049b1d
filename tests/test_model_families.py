"""Parity of the Qwen3, Gemma 2 and gpt-oss families (``LlamaConfig.family``) with transformers'
``Qwen3ForCausalLM``, ``Gemma2ForCausalLM`` and ``GptOssForCausalLM`` on tiny random checkpoints:
``load_hf`` on one device and through rings, ``save_hf`` read back by transformers, the layer
windows per ``layer_types``.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from test_model_hf import LOGITS_RTOL, hf_logits, mesh_of, rel_err

from models import generate as gen
from models import llama
from models.config import LlamaConfig, num_params
from models.hf import config_from_hf
from models.sharding import MeshConfig

torch = pytest.importorskip("torch", reason="HF parity tests need torch (CPU)")
transformers = pytest.importorskip("transformers", reason="HF parity tests need transformers")

WINDOW, BATCH, SEQ = 8, 2, 32  # the sequence is four windows long
NORM_SPREAD = 0.2  # norm weights 1 +- this (Gemma: 0 +- this), so that a mix-up of them shows
SMALL = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
             initializer_range=0.1, max_position_embeddings=256)


def _randomize_norms(model, offset: float) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(offset + NORM_SPREAD * torch.randn_like(p))


def _checkpoint(tmp_path_factory, cls, config, seed: int, offset: float = 1.0):
    """(model dir, torch model, input ids, torch logits) of a random ``cls(config)``."""
    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = cls(config).eval()
    _randomize_norms(model, offset)
    path = str(tmp_path_factory.mktemp(type(model).__name__))
    model.save_pretrained(path)
    ids = np.random.default_rng(seed).integers(0, 256, (BATCH, SEQ))
    return path, model, ids, hf_logits(model, ids)


def _qwen3_config(tied: bool, sliding: bool):
    kw = dict(SMALL, tie_word_embeddings=tied, rope_parameters={"rope_type": "default",
                                                                "rope_theta": 500.0})
    if sliding:  # layer 0 full, layer 1 sliding: a scan over groups of two layers
        kw.update(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    return transformers.Qwen3Config(**kw)


@pytest.fixture(scope="module", params=["untied", "tied_sliding"])
def qwen3(request, tmp_path_factory):
    tied = request.param != "untied"
    return _checkpoint(tmp_path_factory, transformers.Qwen3ForCausalLM,
                       _qwen3_config(tied, sliding=tied), seed=11 + tied)


def test_qwen3_config(qwen3):
    config, params = llama.load_hf(qwen3[0])
    assert config.family == "qwen3" and config.head_dim == 32 != config.hidden_size // 4
    assert params["layers"]["attn"]["q_norm"]["scale"].shape == (2, 32)
    assert ("lm_head" in params) != config.tie_embeddings
    if config.sliding_window is not None:
        assert config.layer_types == ("full_attention", "sliding_attention")
        assert config.layer_period == 2 and config.layer_window(1) == WINDOW
    count = sum(x.size for x in jax.tree.leaves(params))
    assert num_params(config) == count


def test_qwen3_parity_single_device(qwen3):
    path, _, ids, ref = qwen3
    config, params = llama.load_hf(path)
    assert rel_err(llama.forward(config, params, ids), ref) < LOGITS_RTOL
    unscanned, params2 = llama.load_hf(path, scan_layers=False)
    assert rel_err(llama.forward(unscanned, params2, ids), ref) < LOGITS_RTOL
    if config.sliding_window is not None:  # the window matters at this length
        full = dataclasses.replace(config, sliding_window=None, layer_types=None)
        assert rel_err(llama.forward(full, params, ids), ref) > 100 * LOGITS_RTOL


@pytest.mark.parametrize("mesh_config,layout", [(MeshConfig(sp=2), "contiguous"),
                                                (MeshConfig(tp=2, sp=4), "zigzag")], ids=str)
def test_qwen3_parity_ring(qwen3, mesh_config, layout):
    path, _, ids, ref = qwen3
    config, params = llama.load_hf(path, layout=layout)
    mesh = mesh_of(mesh_config)
    params = jax.device_put(params, llama.param_shardings(config, mesh))
    assert rel_err(llama.forward(config, params, ids, mesh=mesh), ref) < LOGITS_RTOL


def _round_trip(path: str, cls, tmp_path, ids, ref) -> LlamaConfig:
    """load_hf -> save_hf -> transformers' from_pretrained and load_hf give the same model."""
    config, params = llama.load_hf(path)
    out = str(tmp_path / "saved")
    llama.save_hf(config, params, out)
    model = cls.from_pretrained(out, attn_implementation="eager").eval()
    assert rel_err(hf_logits(model, ids), ref) < LOGITS_RTOL
    config2, params2 = llama.load_hf(out)
    assert config2 == config
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 params, params2)
    return config


def test_qwen3_save_hf_round_trip(qwen3, tmp_path):
    path, model, ids, ref = qwen3
    _round_trip(path, transformers.Qwen3ForCausalLM, tmp_path, ids, ref)


def test_new_families_refuse_decoding(qwen3):
    config, params = llama.load_hf(qwen3[0])
    with pytest.raises(ValueError, match="qwen3"):
        gen.prefill(config, params, np.zeros((1, 8), np.int32), np.array([4]))


def test_config_checks():
    with pytest.raises(ValueError, match="family"):
        LlamaConfig(family="gpt2")
    with pytest.raises(ValueError, match="layer_types"):
        LlamaConfig(layer_types=("full_attention",))
    with pytest.raises(ValueError, match="experts_per_token"):
        LlamaConfig(family="gpt_oss", num_experts=4, experts_per_token=5)
    with pytest.raises(ValueError, match="num_experts"):
        LlamaConfig(num_experts=4, experts_per_token=1)
    with pytest.raises(ValueError, match="model_type"):
        config_from_hf({"model_type": "gpt2"})
    # layer_types from YAML lists become tuples (configs stay hashable)
    assert LlamaConfig(layer_types=["full_attention"] * 2).layer_types == ("full_attention",) * 2
