"""Optimizer pieces (schedule, weight-decay mask), metrics helpers and multi-host detection."""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import pytest

from train import distributed, metrics, optim
from train.config import DistributedSection, OptimSection


def test_schedule_warms_up_then_decays_to_the_floor():
    cfg = OptimSection(lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    lr = optim.schedule(cfg, 100)
    values = np.array([float(lr(c)) for c in range(100)])  # c = updates done before this one
    assert values[0] > 0 and values[0] == pytest.approx(0.1)
    assert (np.diff(values[:10]) > 0).all() and values[9] == pytest.approx(1.0)
    assert (np.diff(values[9:]) <= 1e-7).all() and values[-1] == pytest.approx(0.1)


def test_weight_decay_only_on_matrices():
    from models import llama

    params = llama.abstract_params(llama.get_config("debug"))
    for decay_emb in (False, True):
        mask = optim.decay_mask(params, decay_emb)
        flat = {jax.tree_util.keystr(p): m for p, m in jax.tree_util.tree_flatten_with_path(mask)[0]}
        assert flat and all(not m for k, m in flat.items() if "norm" in k or "scale" in k)
        assert all(m for k, m in flat.items() if k.endswith("['wq']") or "w_up" in k)
        assert [m for k, m in flat.items() if "embedding" in k] == [decay_emb]


def test_adamw_keeps_master_weights_float32():
    # bfloat16 gradients (from bf16 compute) must not turn float32 master weights into bfloat16
    params = {"layers": {"wq": np.ones((4, 3), np.float32), "attn_norm": {"scale": np.ones(4, np.float32)}}}
    tx = optim.make_optimizer(OptimSection(), 10)
    state = tx.init(params)
    grads = jax.tree.map(lambda p: jax.numpy.full(p.shape, 0.5, jax.numpy.bfloat16), params)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)  # as the train step does
    updates, state = tx.update(grads, state, params)
    new = jax.tree.map(lambda p, u: p + u, params, updates)
    assert {str(x.dtype) for x in jax.tree.leaves(new)} == {str(x.dtype) for x in jax.tree.leaves(params)}
    moments = [x for x in jax.tree.leaves(state) if getattr(x, "ndim", 0) >= 1]
    assert moments and all(x.dtype != jax.numpy.bfloat16 for x in moments)


def test_mfu_and_peak():
    # the training loop uses models.flops' one convention: the datasheet dense bf16 peak, the same
    # 989 TFLOP/s for an H100 and an H200 (tests/test_flops.py checks every device of the table)
    assert metrics.peak_tflops("NVIDIA H200") == (989.0, "datasheet")
    assert metrics.peak_tflops("NVIDIA H100 80GB HBM3") == (989.0, "datasheet")
    assert metrics.peak_tflops("TPU v5 lite") == (197.0, "datasheet")
    assert metrics.peak_tflops("anything", override=5.0) == (5.0, "config")
    assert math.isnan(metrics.peak_tflops("unknown accelerator").tflops)
    # 1e12 FLOP in 1 s on one device of 2 TFLOP/s peak is half the peak
    assert metrics.mfu(1e12, 1.0, 1, 2.0) == pytest.approx(0.5)


def test_multi_process_detection(monkeypatch):
    for var in ("SLURM_NTASKS", "TPU_WORKER_HOSTNAMES", "JAX_COORDINATOR_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    cfg = DistributedSection()
    assert not distributed.wants_initialize(cfg)
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert distributed.wants_initialize(cfg)
    assert not distributed.wants_initialize(dataclasses.replace(cfg, initialize="never"))
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "a,b")
    assert distributed.wants_initialize(cfg)
    monkeypatch.delenv("TPU_WORKER_HOSTNAMES")
    flags = dataclasses.replace(cfg, coordinator_address="h:1", num_processes=2, process_id=0)
    assert distributed.wants_initialize(flags)
    with pytest.raises(ValueError, match="process_id"):
        distributed.initialize(dataclasses.replace(flags, process_id=-1))
