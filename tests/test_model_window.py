"""Sliding-window (Mistral) models: parity with transformers' MistralForCausalLM on tiny random
checkpoints at lengths beyond the window, on one device and on rings, and KV-cache decoding
against a full forward pass with the window.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ringcheck import F32_RTOL
from test_model_hf import LOGITS_RTOL, hf_logits, mesh_of, rel_err

from models import flops, kvcache, llama
from models import generate as gen
from models.hf import config_from_hf
from models.sharding import MeshConfig

torch = pytest.importorskip("torch", reason="HF parity tests need torch (CPU)")
transformers = pytest.importorskip("transformers", reason="HF parity tests need transformers")

WINDOW, BATCH, SEQ = 8, 2, 32  # the sequence is four windows long
ATTN_IMPLS = ("eager", "sdpa")  # transformers' CPU attentions; both build the sliding-window mask


def _mistral_config(attn: str):
    kw = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        sliding_window=WINDOW,
        initializer_range=0.1,
        max_position_embeddings=256,
    )
    if int(transformers.__version__.split(".")[0]) >= 5:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 500.0}
    else:
        kw["rope_theta"] = 500.0
    config = transformers.MistralConfig(**kw)
    config._attn_implementation = attn
    return config


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    """(checkpoint dir, input ids, {attention implementation: transformers logits})."""
    torch.manual_seed(7)
    model = transformers.MistralForCausalLM(_mistral_config("eager")).eval()
    with torch.no_grad():  # norms away from 1 so that a mix-up of them shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
    path = str(tmp_path_factory.mktemp("mistral"))
    model.save_pretrained(path)
    ids = np.random.default_rng(0).integers(0, 256, (BATCH, SEQ))
    logits = {}
    for attn in ATTN_IMPLS:
        m = transformers.MistralForCausalLM.from_pretrained(path, attn_implementation=attn).eval()
        assert m.config._attn_implementation == attn and m.config.sliding_window == WINDOW
        logits[attn] = hf_logits(m, ids)
    return path, ids, logits


def test_mistral_parity_single_device(mistral):
    path, ids, ref = mistral
    config, params = llama.load_hf(path)
    assert config.sliding_window == WINDOW
    out = llama.forward(config, params, ids)
    for attn in ATTN_IMPLS:
        assert rel_err(out, ref[attn]) < LOGITS_RTOL, attn
    # the window matters at this length: without it the logits are far off
    full = llama.forward(dataclasses.replace(config, sliding_window=None), params, ids)
    assert rel_err(full, ref["sdpa"]) > 100 * LOGITS_RTOL


@pytest.mark.parametrize(
    "mesh_config,layout",
    [
        pytest.param(MeshConfig(sp=4), "contiguous", marks=pytest.mark.slow),
        (MeshConfig(tp=2, sp=4), "zigzag"),
    ],
    ids=str,
)
def test_mistral_parity_ring(mistral, mesh_config, layout):
    """Shards of 8 = the window: contiguous runs a one-hop lap, zigzag one hop each way."""
    path, ids, ref = mistral
    config, params = llama.load_hf(path, layout=layout)
    mesh = mesh_of(mesh_config)
    params = jax.device_put(params, llama.param_shardings(config, mesh))
    assert rel_err(llama.forward(config, params, ids, mesh=mesh), ref["sdpa"]) < LOGITS_RTOL


def test_save_hf_writes_mistral(tmp_path):
    ids = np.random.default_rng(1).integers(0, 256, (BATCH, SEQ))
    config = llama.get_config("debug", sliding_window=5, tie_embeddings=False)
    params = jax.tree.map(lambda x: x * 3, llama.init_params(config, jax.random.key(4)))
    llama.save_hf(config, params, str(tmp_path))
    with open(tmp_path / "config.json") as f:
        hf = json.load(f)
    assert hf["model_type"] == "mistral" and hf["sliding_window"] == 5
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert isinstance(model, transformers.MistralForCausalLM)
    assert rel_err(llama.forward(config, params, ids), hf_logits(model, ids)) < LOGITS_RTOL
    config2, _ = llama.load_hf(str(tmp_path), loss_chunk=config.loss_chunk)
    assert config2 == config
    # a Mistral config.json without a window (Mistral v0.2+: "sliding_window": null) is full causal
    assert config_from_hf({**hf, "sliding_window": None}).sliding_window is None


@pytest.mark.parametrize("window", [0, -1, 2.5, True, 2**31])
def test_config_rejects_bad_windows(window):
    with pytest.raises(ValueError, match="sliding_window"):
        llama.get_config("debug", sliding_window=window)


def test_flops_count_only_keys_in_the_window():
    config = llama.get_config("debug", sliding_window=4096)
    full = dataclasses.replace(config, sliding_window=None)
    seq, w = 1 << 20, 4096
    dense = 6 * flops.matmul_params(config)
    per_pair = 12 * config.num_layers * config.num_heads * config.head_dim
    # causal: the first W queries see 1..W keys, every later one exactly W
    keys_per_query = (w * (w + 1) / 2 + (seq - w) * w) / seq
    assert llama.flops_per_token(config, seq) == pytest.approx(dense + per_pair * keys_per_query)
    assert llama.flops_per_token(full, seq) == pytest.approx(dense + per_pair * (seq + 1) / 2)
    assert llama.flops_per_token(config, 1000) == llama.flops_per_token(full, 1000)


# ---- KV-cache decoding ---------------------------------------------------------------------------

NEW = 5


@pytest.fixture(scope="module")
def params():
    return llama.init_params(llama.get_config("debug"), jax.random.key(0))


@pytest.mark.parametrize("sp,layout", [pytest.param(1, "contiguous", marks=pytest.mark.slow), (4, "zigzag")])
def test_decode_with_window_matches_full_forward(params, sp, layout):
    """Prompts longer and shorter than the window; every decode step's logits against a full
    forward pass of the naive attention with the same window."""
    rng = np.random.default_rng(3)
    rows = [[int(t) for t in rng.integers(0, 256, n)] for n in (13, 4, 9)]
    config = llama.get_config("debug", attention="xla", layout=layout, sliding_window=6)
    mesh = None if sp == 1 else mesh_of(MeshConfig(sp=sp))
    out = gen.generate(
        config, params, rows, max_new_tokens=NEW, mesh=mesh, share_prefix=False, return_logits=True
    )
    ref_cfg = llama.get_config("debug", attention="reference", sliding_window=6)
    for b, row in enumerate(rows):
        full = row + out.tokens[b]
        ref = np.asarray(llama.forward(ref_cfg, params, jnp.asarray([full[:-1]]))[0])
        for step in range(NEW):
            err = rel_err(out.logits[step, b], ref[len(row) - 1 + step])
            assert err < F32_RTOL, (b, step, err)


def test_rotating_decode_refuses_windows(params):
    config = llama.get_config("debug", attention="xla", sliding_window=6)
    kv = jnp.zeros((config.num_layers, 1, 16, config.num_kv_heads, config.head_dim))
    cache = kvcache.KVCache(kv, kv, jnp.asarray([4], jnp.int32))
    with pytest.raises(ValueError, match="sliding_window"):
        gen.extend(config, params, cache, np.zeros((1, 1), np.int32), mode="rotate")
