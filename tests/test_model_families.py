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
from ringattention import implementation_names, implementations

torch = pytest.importorskip("torch", reason="HF parity tests need torch (CPU)")
transformers = pytest.importorskip("transformers", reason="HF parity tests need transformers")

WINDOW, BATCH, SEQ = 8, 2, 32  # the sequence is four windows long
LOSS_ATOL = 1e-4  # float32 mean cross-entropy vs the same from float64 forward logits
NORM_SPREAD = 0.2  # norm weights 1 +- this (Gemma: 0 +- this), so that a mix-up of them shows
SMALL = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rms_norm_eps=1e-6,
    initializer_range=0.1,
    max_position_embeddings=256,
)


def _randomize_norms(model, offset: float) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(offset + NORM_SPREAD * torch.randn_like(p))


def _qwen3(tied: bool):
    kw = dict(SMALL, tie_word_embeddings=tied, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    if tied:  # layer 0 full, layer 1 sliding: a scan over groups of two layers
        kw.update(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    return transformers.Qwen3ForCausalLM, transformers.Qwen3Config(**kw), 1.0


def _gemma2():
    """Soft caps small enough to matter at these logit sizes; a softmax scale != head_dim ** -0.5."""
    config = transformers.Gemma2Config(
        **SMALL,
        sliding_window=WINDOW,
        query_pre_attn_scalar=24,
        attn_logit_softcapping=1.0,
        final_logit_softcapping=2.0,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    )
    return transformers.Gemma2ForCausalLM, config, 0.0  # Gemma's norms: y * (1 + weight)


YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 16,
    "rope_theta": 500.0,
}  # scaled at these positions


def _gpt_oss():
    config = transformers.GptOssConfig(
        **{**SMALL, "intermediate_size": 48, "max_position_embeddings": 64},
        sliding_window=WINDOW,
        num_local_experts=4,
        num_experts_per_tok=2,
        rope_parameters=dict(YARN),
    )
    return transformers.GptOssForCausalLM, config, 1.0


BUILDERS = {
    "qwen3": lambda: _qwen3(False),
    "qwen3_tied_sliding": lambda: _qwen3(True),
    "gemma2": _gemma2,
    "gpt_oss": _gpt_oss,
}
EXPERT_GAIN = 8.0  # gpt-oss expert weights times this, so that the SwiGLU clamp at 7 is reached


@pytest.fixture(scope="module", params=list(BUILDERS))
def ckpt(request, tmp_path_factory):
    """(model dir, transformers class, input ids, transformers logits) of a tiny random model."""
    cls, config, offset = BUILDERS[request.param]()
    torch.manual_seed(11)
    config._attn_implementation = "eager"
    model = cls(config).eval()
    _randomize_norms(model, offset)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("sinks", "bias")):  # zero-initialised by transformers
                p.copy_(torch.randn_like(p))
            if "experts.gate_up_proj" in name and not name.endswith("bias"):
                p.mul_(EXPERT_GAIN)
    path = str(tmp_path_factory.mktemp(request.param))
    model.save_pretrained(path)
    ids = np.random.default_rng(5).integers(0, 256, (BATCH, SEQ))
    return path, cls, ids, hf_logits(model, ids)


def test_config_and_params(ckpt):
    config, params = llama.load_hf(ckpt[0])
    assert config.head_dim == 32 != config.hidden_size // config.num_heads
    assert ("lm_head" in params) != config.tie_embeddings
    assert num_params(config) == sum(x.size for x in jax.tree.leaves(params))
    if config.family == "qwen3":
        assert params["layers"]["attn"]["q_norm"]["scale"].shape == (2, 32)
    if config.sliding_window is not None:  # qwen3: (full, sliding); gemma2 / gpt-oss alternate
        sliding = int(config.family == "qwen3")  # the index of the sliding layer
        assert config.layer_period == 2 and config.layer_window(sliding) == WINDOW
        assert config.layer_window(1 - sliding) is None


def _variants(config: LlamaConfig, params) -> dict[str, tuple[LlamaConfig, dict]]:
    """The model without each of its family's options, which must change the logits."""
    out = {}
    if config.sliding_window is not None:
        out["window"] = (dataclasses.replace(config, sliding_window=None, layer_types=None), params)
    if config.family == "gemma2":
        out["attn_softcap"] = (dataclasses.replace(config, attn_logit_softcap=None), params)
        out["final_softcap"] = (dataclasses.replace(config, final_logit_softcap=None), params)
        out["scale"] = (dataclasses.replace(config, query_pre_attn_scalar=None), params)
    if config.family == "gpt_oss":
        out["clamp"] = (dataclasses.replace(config, swiglu_limit=1e9), params)
        no_sinks = jax.tree_util.tree_map_with_path(
            lambda path, x: x - 1e4 if path[-1].key == "sinks" else x, params
        )
        out["sinks"] = (config, no_sinks)
        out["yarn"] = (dataclasses.replace(config, rope_scaling=None), params)
    return out


def test_parity_single_device(ckpt):
    path, _, ids, ref = ckpt
    config, params = llama.load_hf(path)
    assert rel_err(llama.forward(config, params, ids), ref) < LOGITS_RTOL
    unscanned, params2 = llama.load_hf(path, scan_layers=False)
    assert rel_err(llama.forward(unscanned, params2, ids), ref) < LOGITS_RTOL
    naive = dataclasses.replace(config, attention="reference")  # reference_attention's options
    assert rel_err(llama.forward(naive, params, ids), ref) < LOGITS_RTOL
    for option, (cfg, p) in _variants(config, params).items():  # each option matters here
        assert rel_err(llama.forward(cfg, p, ids), ref) > 100 * LOGITS_RTOL, option


@pytest.mark.parametrize(
    "mesh_config,layout",
    [
        (MeshConfig(sp=2), "contiguous"),
        (MeshConfig(tp=2, sp=4), "zigzag"),
        (MeshConfig(tp=2, sp=2, usp=2), "striped"),
    ],
    ids=str,
)
def test_parity_ring(ckpt, mesh_config, layout):
    """sp=4: shards of 8 = the window; usp=2: Ulysses x ring, one head per device (sinks sliced)."""
    path, _, ids, ref = ckpt
    config, params = llama.load_hf(path, layout=layout)
    mesh = mesh_of(mesh_config)
    params = jax.device_put(params, llama.param_shardings(config, mesh))
    assert rel_err(llama.forward(config, params, ids, mesh=mesh), ref) < LOGITS_RTOL


def test_save_hf_round_trip(ckpt, tmp_path):
    """load_hf -> save_hf -> transformers' from_pretrained and load_hf give the same model."""
    path, cls, ids, ref = ckpt
    config, params = llama.load_hf(path)
    out = str(tmp_path / "saved")
    llama.save_hf(config, params, out)
    model = cls.from_pretrained(out, attn_implementation="eager").eval()
    assert rel_err(hf_logits(model, ids), ref) < LOGITS_RTOL
    config2, params2 = llama.load_hf(out)
    assert config2 == config
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)


def test_loss_matches_forward(ckpt):
    """loss_fn (chunked and plain; Gemma 2's final soft cap included) = cross-entropy of forward."""
    path, _, ids, _ = ckpt
    config, params = llama.load_hf(path, layout="contiguous", loss_chunk=8)
    logits = np.asarray(llama.forward(config, params, ids), np.float64)[:, :-1]
    targets = ids[:, 1:]
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    want = np.mean(lse - np.take_along_axis(logits, targets[..., None], -1)[..., 0])
    batch = {"input_ids": ids[:, :-1], "targets": targets}
    for cfg in (config, dataclasses.replace(config, loss_chunk=None)):
        loss, _ = llama.loss_fn(cfg, params, batch)
        assert abs(float(loss) - want) < LOSS_ATOL


def test_new_families_refuse_decoding(ckpt):
    config, params = llama.load_hf(ckpt[0])
    with pytest.raises(ValueError, match=config.family):
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


def test_attention_backends_refuse_options_they_lack(ckpt):
    """cudnn: a ValueError naming sinks / the soft cap; a named ring kernel without "softcap":
    implementations.resolve's ValueError; (qwen3 needs neither: cudnn fails on the CPU platform)."""
    config, params = llama.load_hf(ckpt[0])
    option = {"gemma2": "attn_logit_softcap", "gpt_oss": "sinks"}.get(config.family, "one CUDA GPU")
    with pytest.raises(ValueError, match=option):
        llama.forward(dataclasses.replace(config, attention="cudnn"), params, ckpt[2])
    lacking = [n for n in implementation_names() if "softcap" not in implementations.resolve(n).features]
    if config.family == "gemma2" and lacking:
        with pytest.raises(ValueError, match="softcap"):
            llama.forward(dataclasses.replace(config, attention=lacking[0]), params, ckpt[2])


GRAD_RTOL = 1e-5  # float32 gradients of the same loss under different remat policies


@pytest.mark.parametrize("remat", ["full", "save_attn"])
def test_layer_groups_remat_gradients(ckpt, remat):
    """Layers scanned in (sliding, full) groups: the gradients under remat equal remat="none"."""
    config, params = llama.load_hf(ckpt[0], layout="contiguous", loss_chunk=None)
    if config.layer_period == 1:
        pytest.skip("one window for all layers: the plain layer scan (tests/test_remat.py)")
    ids = ckpt[2]
    batch = {"input_ids": ids[:, :-1], "targets": ids[:, 1:]}
    grad = lambda cfg: jax.grad(lambda p: llama.loss_fn(cfg, p, batch)[0])(params)  # noqa: E731
    want, got = grad(config), grad(dataclasses.replace(config, remat=remat))
    errs = jax.tree.map(rel_err, got, want)
    assert max(jax.tree.leaves(errs)) < GRAD_RTOL, errs
