"""deterministic=True: kernels whose sums have a fixed order, chosen from the ring, the model and
the training config; two training runs and a stop/resume are bitwise equal (CPU).

On the device: ``benchmarks/determinism.py`` (two runs and a stop/resume of ``python -m train``
on one GPU, compared bitwise); its CPU smoke mode runs in tests/test_benchmarks_model.py (slow).
"""

from __future__ import annotations

import dataclasses
import itertools
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import llama
from ringattention import implementations, ring_attention
from ringattention.kernels.hopper import backward as hb
from ringattention.kernels.hopper import cta_dq_bwd as hcb
from ringattention.kernels.hopper import pallas_hopper as ph
from tests.test_train import small
from train import config as config_lib
from train import steps, train
from train.metrics import read_metrics

needs_interpret = pytest.mark.skipif(
    ph.interpret_params() is None, reason="this jax has no Mosaic GPU interpret mode"
)


def test_hopper_deterministic_block_sizes():
    """The fused backward (the default at head dims <= 128, one dq tile per CTA) becomes the
    two-kernel one, at head dims <= 64 with its own tiles (2 stages, 232 registers, 128-key dq
    blocks); the others (the split pair at 256) stay; the forward is the mask's default."""
    for d, causal in itertools.product((40, 64, 96, 128, 256), (True, False)):
        got = ph.deterministic_block_sizes(None, d, causal)
        default = ph.default_block_sizes(d, causal)
        assert got.backward != "fused"
        want = default
        if default.backward == "fused":
            want = dataclasses.replace(default, backward="mosaic")
        if d <= 64:
            want = dataclasses.replace(want, bwd_stages=2, registers=232, bwd_block_k=128)
        assert got == want
        assert (got.block_k, got.stages, got.schedule) == (default.block_k, default.stages, default.schedule)
    hopper = implementations.resolve("pallas_hopper")
    assert implementations.deterministic_block_sizes(hopper, None, 128, causal=False).schedule == "pingpong3"
    mla = implementations.deterministic_block_sizes(hopper, None, 192, causal=False, v_head_dim=128)
    assert mla == dataclasses.replace(ph.default_block_sizes(192, False, v_head_dim=128), backward="mosaic")
    mine = ph.BlockSizes(backward="triton", block_k=64)
    assert ph.deterministic_block_sizes(mine, 128) is mine
    with pytest.raises(ValueError, match="fused"):
        ph.deterministic_block_sizes(ph.BlockSizes(backward="fused"), 128)
    xla = implementations.resolve("xla")  # no hook: deterministic as it is
    assert implementations.deterministic_block_sizes(xla, "given", 128) == "given"


@pytest.fixture
def backward_calls(monkeypatch):
    """Records which pallas_hopper backward runs ("mosaic" / "fused") while tracing."""
    calls = []
    for name, module in (("mosaic", hb), ("fused", hcb)):
        original = module.backward
        monkeypatch.setattr(
            module, "backward", lambda *a, _o=original, _n=name, **k: (calls.append(_n), _o(*a, **k))[1]
        )
    return calls


def _ring_loss(deterministic: bool, causal: bool = True):
    def loss(q, k, v):
        run = lambda q, k, v: ring_attention(
            q,
            k,
            v,
            "sp",
            causal=causal,
            implementation="pallas_hopper",
            interpret=True,
            deterministic=deterministic,
        )
        out = jax.vmap(run, axis_name="sp", axis_size=1)(q[None], k[None], v[None])[0]
        return out.astype(jnp.float32).sum()

    return loss


@needs_interpret
@pytest.mark.parametrize("deterministic", [False, True])
def test_ring_flag_picks_the_hopper_backward(backward_calls, deterministic):
    q = jax.ShapeDtypeStruct((1, 128, 2, 128), jnp.bfloat16)  # head dim 128: "fused" by default
    k = jax.ShapeDtypeStruct((1, 128, 1, 128), jnp.bfloat16)
    jax.eval_shape(jax.grad(_ring_loss(deterministic), argnums=(0, 1, 2)), q, k, k)
    assert backward_calls == ["mosaic" if deterministic else "fused"]


@needs_interpret
def test_deterministic_ring_runs_the_forward_of_its_mask(forward_loops_used):
    """deterministic=True changes the backward only: the forward is the default's, at head dim
    128 the three-warpgroup ping-pong with a causal mask and without (deterministic too: each
    query row is written by one CTA, the rows a last CTA overlaps by the one before), for MLA
    (192 / 128) without a causal mask FA3's overlapped loop."""
    used = forward_loops_used
    for causal, dims, want in (
        (False, (128, 128), ("loops", True, 3)),
        (True, (128, 128), ("loops", True, 3)),
        (False, (192, 128), ("overlap_loops", False, 2)),
    ):
        q = jax.ShapeDtypeStruct((1, 256, 2, dims[0]), jnp.bfloat16)
        k = jax.ShapeDtypeStruct((1, 256, 1, dims[0]), jnp.bfloat16)
        v = jax.ShapeDtypeStruct((1, 256, 1, dims[1]), jnp.bfloat16)
        used.clear()
        jax.eval_shape(_ring_loss(True, causal), q, k, v)
        assert set(used) == {want}, (causal, dims)


@needs_interpret
@pytest.mark.parametrize("deterministic", [False, True])
def test_model_flag_reaches_the_kernel(backward_calls, deterministic):
    config = llama.get_config(
        "debug",
        hidden_size=256,
        num_heads=2,
        num_kv_heads=1,
        head_dim=128,
        num_layers=1,
        dtype="bfloat16",
        attention="pallas_hopper",
        interpret=True,
        deterministic=deterministic,
    )
    ids = jnp.zeros((1, 128), jnp.int32)
    batch = {"input_ids": ids, "targets": ids}
    loss = lambda p: llama.loss_fn(config, p, batch)[0]  # noqa: E731
    jax.eval_shape(jax.grad(loss), llama.abstract_params(config))
    assert set(backward_calls) == {"mosaic" if deterministic else "fused"}


def test_training_config_turns_it_on(tmp_path, monkeypatch):
    config = small(tmp_path, "--deterministic=true")
    assert steps.model_config(config).deterministic and not steps.model_config(small(tmp_path)).deterministic
    with pytest.raises(ValueError, match="top-level option deterministic"):
        config_lib.check(small(tmp_path, "--model.overrides.deterministic=true"))
    assert config_lib.xla_deterministic(f"--foo=1 {config_lib.XLA_DETERMINISTIC}")
    assert config_lib.xla_deterministic("--xla_gpu_exclude_nondeterministic_ops")
    assert not config_lib.xla_deterministic(
        f"{config_lib.XLA_DETERMINISTIC} --xla_gpu_deterministic_ops=false"
    )
    # a library caller on a GPU without XLA's flag is told, before anything runs
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", "").replace(config_lib.XLA_DETERMINISTIC, ""))
    with pytest.raises(config_lib.ConfigError, match="xla_gpu_deterministic_ops"):
        train.main(dataclasses.replace(config, cpu_devices=0))


def _records(run_dir) -> dict[int, dict]:
    timing = ("tokens_per_sec", "mfu")
    return {
        r["step"]: {k: v for k, v in r.items() if k not in timing}
        for r in read_metrics(str(run_dir))
        if "loss" in r
    }


def test_two_runs_and_a_resume_are_bitwise_equal(tmp_path):
    det = ("--deterministic=true", "--checkpoint.every=0")  # checkpoints at the stop steps only
    a = train.main(small(tmp_path / "a", *det, "--stop_at=4"))
    b = train.main(small(tmp_path / "b", *det, "--stop_at=4"))
    train.main(small(tmp_path / "c", *det, "--stop_at=2"))
    c = train.main(small(tmp_path / "c", *det, "--stop_at=4"))
    assert sorted(_records(tmp_path / "a")) == [1, 2, 3, 4]
    assert _records(tmp_path / "b") == _records(tmp_path / "a")
    assert _records(tmp_path / "c") == _records(tmp_path / "a")
    chex.assert_trees_all_equal(jax.device_get(b.params), jax.device_get(a.params))
    chex.assert_trees_all_equal(jax.device_get(c.params), jax.device_get(a.params))
    assert np.isfinite(list(a.losses.values())).all()
