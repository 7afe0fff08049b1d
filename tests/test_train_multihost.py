"""Two processes x 4 CPU devices (jax.distributed on localhost) train like one process x 8."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys

import jax
import numpy as np

from models import llama
from models.sharding import MeshConfig, make_mesh
from tests.test_train import DEBUG, SMALL, small
from train import steps, train
from train.checkpoint import Checkpointer
from train.metrics import read_metrics

MULTIHOST_RTOL = 1e-5  # gloo all-reduces vs in-process ones: summation order may differ
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOP = ["--stop_at=3"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_two(run_dir) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    procs = []
    for pid in range(2):
        cmd = [sys.executable, "-m", "train", "--config", DEBUG, *SMALL, *STOP,
               f"--run_dir={run_dir}", "--cpu_devices=4",
               f"--distributed.coordinator_address=127.0.0.1:{port}",
               "--distributed.num_processes=2", f"--distributed.process_id={pid}"]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=300)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]


def test_two_processes_agree_with_one(tmp_path):
    _launch_two(tmp_path / "two")
    one = train.main(small(tmp_path / "one", *STOP))
    two = {r["step"]: r["loss"] for r in read_metrics(str(tmp_path / "two")) if "loss" in r}
    assert sorted(two) == [1, 2, 3]
    # every row's FLOPs counted once over the two processes, as one process counts them
    flops = lambda d: [r["model_flops"] for r in read_metrics(str(d)) if "loss" in r]  # noqa: E731
    assert flops(tmp_path / "two") == flops(tmp_path / "one")
    np.testing.assert_allclose([two[s] for s in (1, 2, 3)], [one.losses[s] for s in (1, 2, 3)],
                               rtol=MULTIHOST_RTOL)
    # the checkpoint the two processes wrote together restores here, sharded over 8 devices
    config = small(tmp_path / "one", *STOP)
    mesh = make_mesh(MeshConfig(**dataclasses.asdict(config.mesh)))
    model = llama.get_config(config.model.preset, **config.model.overrides)
    fns = steps.functions(model, mesh, config.optim, config.steps)
    ckpt = Checkpointer(str(tmp_path / "two" / "checkpoints"), keep=2, async_save=False)
    assert ckpt.latest() == 3
    params = ckpt.restore(3, fns.params_abstract)["params"]
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(one.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=MULTIHOST_RTOL,
                                   atol=MULTIHOST_RTOL)
