"""Sequence-sharded KV cache and generation: every decode step against a full forward pass."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ringcheck import F32_RTOL

from models import generate as gen
from models import kvcache, llama
from models.sharding import MeshConfig, make_mesh
from ringattention import layouts

NEW = 5  # tokens generated per test


def rel_err(x, ref) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(x)), "non-finite values"
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))


@pytest.fixture(scope="module")
def params():
    return llama.init_params(llama.get_config("debug"), jax.random.key(0))


def config(layout: str = "contiguous", **kw) -> llama.LlamaConfig:
    return llama.get_config("debug", attention="xla", layout=layout, **kw)


def mesh_of(sp: int, dp: int = 1, usp: int = 1):
    if sp == 1 and dp == 1 and usp == 1:
        return None
    return make_mesh(MeshConfig(dp=dp, sp=sp, usp=usp), jax.devices()[: sp * dp * usp])


def prompts(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, 256, n)] for n in lengths]


def reference_logits(params, row: list[int]) -> np.ndarray:
    """float32 logits [len(row), vocab] of one sequence alone, naive attention, one device."""
    ref_cfg = llama.get_config("debug", attention="reference")
    return np.asarray(llama.forward(ref_cfg, params, jnp.asarray([row]))[0])


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
@pytest.mark.parametrize("ring", [1, 2, 4])
def test_slot_inverts_layout(layout, ring):
    T = 16 * ring
    perm = layouts.permutation(T, layout, ring)  # layout index -> position
    owner, idx = kvcache.slot(jnp.arange(T), layout, T // ring, ring)
    assert np.array_equal(perm[np.asarray(owner) * (T // ring) + np.asarray(idx)], np.arange(T))


@pytest.mark.parametrize(
    "sp,layout,usp",
    [
        (1, "contiguous", 1),
        (2, "striped", 1),
        (4, "zigzag", 1),
        (4, "contiguous", 1),
        pytest.param(2, "zigzag", 2, marks=pytest.mark.slow),
    ],
)
def test_decode_steps_match_full_forward(params, sp, layout, usp):
    # usp: a Ulysses x ring prefill; the decode keeps the cache over sp (replicated over usp)
    rows = prompts([13, 6, 9])
    out = gen.generate(
        config(layout),
        params,
        rows,
        max_new_tokens=NEW,
        mesh=mesh_of(sp, usp=usp),
        share_prefix=False,
        return_logits=True,
    )
    assert out.logits.shape == (NEW, len(rows), 256)
    for b, row in enumerate(rows):
        full = row + out.tokens[b]
        assert len(out.tokens[b]) == NEW and out.finish[b] == "length"
        ref = reference_logits(params, full[:-1])  # the logits that predicted each new token
        for step in range(NEW):
            err = rel_err(out.logits[step, b], ref[len(row) - 1 + step])
            assert err < F32_RTOL, (b, step, err)


@pytest.mark.parametrize("sp,layout", [(2, "zigzag"), (4, "striped")])
def test_ring_prefill_equals_one_device(params, sp, layout):
    cfg, rows = config(layout), prompts([40, 23])
    T = 16 * kvcache.granularity(layout, sp)
    buf = np.zeros((2, T), np.int32)
    for i, r in enumerate(rows):
        buf[i, : len(r)] = r
    lengths = [len(r) for r in rows]
    logits, cache = gen.prefill(cfg, params, buf, lengths, mesh=mesh_of(sp))
    logits1, cache1 = gen.prefill(cfg, params, buf, lengths)
    assert cache.ring == sp and cache1.ring == 1
    assert cache.k.shape == cache1.k.shape == (cfg.num_layers, 2, T, cfg.num_kv_heads, cfg.head_dim)
    assert rel_err(logits, logits1) < F32_RTOL
    for a, b in zip(kvcache.to_natural(cache), kvcache.to_natural(cache1), strict=True):
        for i, n in enumerate(lengths):
            assert rel_err(a[:, i, :n], b[:, i, :n]) < F32_RTOL


def test_batch_equals_each_alone(params):
    cfg, mesh, rows = config("zigzag"), mesh_of(2), prompts([5, 17, 11], seed=1)
    batch = gen.generate(
        cfg, params, rows, max_new_tokens=NEW, mesh=mesh, share_prefix=False, return_logits=True
    )
    for b, row in enumerate(rows):
        alone = gen.generate(cfg, params, [row], max_new_tokens=NEW, mesh=mesh, return_logits=True)
        assert alone.tokens[0] == batch.tokens[b]
        assert rel_err(batch.logits[:, b], alone.logits[:, 0]) < F32_RTOL


def test_shared_prefix_prefilled_once(params):
    cfg, mesh = config("contiguous"), mesh_of(2, dp=2)
    prefix = prompts([20], seed=2)[0]
    rows = [prefix + s for s in prompts([3, 7, 1], seed=3)]  # 3 rows: batch padded to dp=2
    shared = gen.generate(cfg, params, rows, max_new_tokens=NEW, mesh=mesh, return_logits=True)
    plain = gen.generate(
        cfg, params, rows, max_new_tokens=NEW, mesh=mesh, share_prefix=False, return_logits=True
    )
    assert shared.shared_prefix == len(prefix) and plain.shared_prefix == 0
    assert shared.tokens == plain.tokens
    assert rel_err(shared.logits, plain.logits) < F32_RTOL


def test_rotating_baseline_equals_allreduce(params):
    cfg, mesh, rows = config("striped"), mesh_of(4), prompts([9, 14])
    a = gen.generate(cfg, params, rows, max_new_tokens=3, mesh=mesh, return_logits=True, share_prefix=False)
    b = gen.generate(
        cfg, params, rows, max_new_tokens=3, mesh=mesh, return_logits=True, share_prefix=False, mode="rotate"
    )
    assert a.tokens == b.tokens
    assert rel_err(b.logits, a.logits) < F32_RTOL


def test_sampling_restrictions():
    logits = jax.random.normal(jax.random.key(1), (4, 50))
    greedy = np.asarray(jnp.argmax(logits, -1))
    keys = jax.random.split(jax.random.key(2), 64)
    for kw in (dict(temperature=1.0, top_k=1), dict(temperature=2.0, top_p=1e-6)):
        assert np.array_equal(gen.sample_logits(logits, keys[0], **kw), greedy)
    top3 = np.asarray(jax.lax.top_k(logits, 3)[1])
    draws = np.stack(
        [np.asarray(gen.sample_logits(logits, k, temperature=1.0, top_k=3)) for k in keys]
    )  # [64, 4]
    for b in range(4):
        assert set(draws[:, b]) <= set(top3[b]) and len(set(draws[:, b])) > 1
    probs = np.asarray(jax.nn.softmax(logits, -1))
    order = np.argsort(-probs, -1)
    nucleus = [set(o[: np.searchsorted(np.cumsum(p[o]), 0.5) + 1]) for o, p in zip(order, probs)]
    draws = np.stack([np.asarray(gen.sample_logits(logits, k, temperature=1.0, top_p=0.5)) for k in keys])
    for b in range(4):
        assert set(draws[:, b]) <= nucleus[b]


def test_stop_tokens_and_streaming(params):
    cfg, rows = config(), prompts([7, 4], seed=4)
    free = gen.generate(cfg, params, rows, max_new_tokens=NEW)
    stop = free.tokens[0][2]  # row 0 stops at its third token (if not earlier)
    seen: list[tuple[int, int]] = []
    out = gen.generate(
        cfg, params, rows, max_new_tokens=NEW, stop_ids=[stop], stream=lambda r, t: seen.append((r, t))
    )
    cut = free.tokens[0].index(stop)
    assert out.tokens[0] == free.tokens[0][:cut] and out.finish[0] == "stop"
    for r in range(2):
        assert [t for (i, t) in seen if i == r] == out.tokens[r]
    checked = gen.generate(cfg, params, rows, max_new_tokens=NEW, stop_check=lambda r, ids: len(ids) >= 2)
    assert [len(t) for t in checked.tokens] == [2, 2] and checked.finish == ["stop", "stop"]


def test_bad_inputs(params):
    cfg = config()
    with pytest.raises(ValueError, match="prompts"):
        gen.generate(cfg, params, [[1, 2], []], max_new_tokens=2)
    with pytest.raises(ValueError, match="vocab_size"):
        gen.generate(cfg, params, [[1, 999]], max_new_tokens=2)
    with pytest.raises(ValueError, match="cache_len"):
        gen.generate(cfg, params, [[1, 2, 3]], max_new_tokens=8, cache_len=8)
    with pytest.raises(ValueError, match="top_p"):
        gen.Sampling(temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match="divisible"):
        gen.prefill(
            dataclasses.replace(cfg, layout="zigzag"),
            params,
            np.zeros((1, 12), np.int32),
            [3],
            mesh=mesh_of(4),
        )


def test_cli_streams_and_cuts_stop_strings(capsys):
    texts = gen.main(
        [
            "--preset",
            "debug",
            "--prompt",
            "abc",
            "--max-new-tokens",
            "12",
            "--stream",
            "--sp",
            "2",
            "--stop",
            "e",
            "--temperature",
            "0.9",
            "--top-k",
            "40",
        ]
    )
    streamed = capsys.readouterr().out
    assert len(texts) == 1 and "e" not in texts[0]
    assert streamed.startswith(texts[0])


def test_causal_paths_default_to_zigzag(params):
    """No layout given: the prefill and its KV cache run a zigzag ring (balanced causal work) and match
    one device; a cache length that zigzag cannot split is a clear error naming the alternative."""
    cfg = llama.get_config("debug", attention="xla")
    assert cfg.layout == "zigzag" and gen.load_model(preset="debug")[0].layout == "zigzag"
    rows = prompts([21, 10], seed=5)
    T = gen.cache_length(24, cfg.layout, 4)
    buf = np.zeros((2, T), np.int32)
    for i, r in enumerate(rows):
        buf[i, : len(r)] = r
    logits, cache = gen.prefill(cfg, params, buf, [21, 10], mesh=mesh_of(4))
    logits1, _ = gen.prefill(cfg, params, buf, [21, 10])
    assert (cache.layout, cache.ring) == ("zigzag", 4)
    assert rel_err(logits, logits1) < F32_RTOL
    # decoding from a zigzag cache: test_decode_steps_match_full_forward
    with pytest.raises(ValueError, match="seq_len=36 must be divisible by 8 .*'striped'"):
        gen.prefill(cfg, params, np.zeros((1, 36), np.int32), [3], mesh=mesh_of(4))


@pytest.mark.parametrize(
    "argv, error",
    [
        (["--bogus"], "one of the arguments --hf --preset is required"),
        (
            ["--preset", "debug", "--prompt", "a", "--max-tokens", "3"],
            "unrecognized arguments: --max-tokens 3",
        ),
        (["--preset", "debug"], "give at least one --prompt or --prompt-file"),
        (
            ["--preset", "debug", "--prompt", "a", "--temperature", "-1"],
            "bad sampling: self.temperature=-1.0",
        ),
        (["--preset", "debug", "--prompt", "a", "--max-new-tokens", "0"], "--max-new-tokens=0 must"),
        (["--preset", "nope", "--prompt", "a"], "config name='nope' is not a preset; choose one of"),
        (
            ["--hf", "/nonexistent", "--prompt", "a"],
            "[Errno 2] No such file or directory: '/nonexistent/config.json'",
        ),
        (
            ["--preset", "debug", "--prompt-file", "/nonexistent"],
            "--prompt-file '/nonexistent' cannot be read",
        ),
    ],
)
def test_cli_mistakes_are_one_line(capsys, argv, error):
    from models import cli

    with pytest.raises(SystemExit) as exit_info:  # as `python -m models.generate` runs it
        import sys

        sys.exit(cli.run(gen.main, "python -m models.generate", argv))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"python -m models.generate: error: {error}"), err


def test_train_generate_cli_mistakes_are_one_line(tmp_path, capsys):
    from train import generate as train_generate

    assert train_generate.cli(["--run_dir", str(tmp_path), "--prompt", "a"]) == 2
    assert train_generate.cli(["needle", "--run_dir", str(tmp_path), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    cmd = "python -m train.generate"
    assert err == [
        f"{cmd}: error: config file '{tmp_path}/config.yaml' does not exist",
        f"{cmd} needle: error: config file '{tmp_path}/config.yaml' does not exist",
    ]
