"""Two processes x 4 CPU devices (jax.distributed on localhost) train like one process x 8."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

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


def _launch_two(run_dir, extra=None, timeout: float = 300) -> tuple[list[int], list[str]]:
    """Runs ``python -m train`` as processes 0 and 1 (``extra[i]``: process i's own options);
    returns their exit statuses and outputs. Processes still running after ``timeout`` are killed."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    procs = []
    for pid in range(2):
        cmd = [
            sys.executable,
            "-m",
            "train",
            "--config",
            DEBUG,
            *SMALL,
            *STOP,
            f"--run_dir={run_dir}",
            "--cpu_devices=4",
            f"--distributed.coordinator_address=127.0.0.1:{port}",
            "--distributed.num_processes=2",
            f"--distributed.process_id={pid}",
            *(extra or {}).get(pid, []),
        ]
        procs.append(
            subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outs, deadline = [], time.monotonic() + timeout
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(deadline - time.monotonic(), 1))[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [p.returncode for p in procs], outs


def test_two_processes_agree_with_one(tmp_path):
    codes, outs = _launch_two(tmp_path / "two")
    assert codes == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    one = train.main(small(tmp_path / "one", *STOP))
    two = {r["step"]: r["loss"] for r in read_metrics(str(tmp_path / "two")) if "loss" in r}
    assert sorted(two) == [1, 2, 3]
    # every row's FLOPs counted once over the two processes, as one process counts them
    flops = lambda d: [r["model_flops"] for r in read_metrics(str(d)) if "loss" in r]  # noqa: E731
    assert flops(tmp_path / "two") == flops(tmp_path / "one")
    np.testing.assert_allclose(
        [two[s] for s in (1, 2, 3)], [one.losses[s] for s in (1, 2, 3)], rtol=MULTIHOST_RTOL
    )
    # the checkpoint the two processes wrote together restores here, sharded over 8 devices
    config = small(tmp_path / "one", *STOP)
    mesh = make_mesh(MeshConfig(**dataclasses.asdict(config.mesh)))
    model = llama.get_config(config.model.preset, **config.model.overrides)
    fns = steps.functions(model, mesh, config.optim, config.steps)
    ckpt = Checkpointer(str(tmp_path / "two" / "checkpoints"), keep=2, async_save=False)
    assert ckpt.latest() == 3
    params = ckpt.restore(3, fns.params_abstract)["params"]
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(one.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=MULTIHOST_RTOL, atol=MULTIHOST_RTOL)


FAIL_WITHIN_S = 60  # every process of the job must have exited by then


@pytest.mark.parametrize(
    "bad_pid, bad, error",
    [
        (0, "--optim.lr=-1", "config error: optim.lr=-1.0 must be >= 0"),  # before jax starts
        (1, "--data.paths=[/nonexistent/*.jsonl]", "config error: data.paths entry"),  # after
    ],
)
def test_one_failing_process_ends_the_job(tmp_path, bad_pid, bad, error):
    """One process gets a bad setting: it exits 2 with the one-line error, the other exits non-zero
    soon after naming the failed process and its error (not after minutes at a barrier)."""
    start = time.monotonic()
    codes, outs = _launch_two(tmp_path / "run", extra={bad_pid: [bad]}, timeout=FAIL_WITHIN_S)
    assert time.monotonic() - start < FAIL_WITHIN_S, (codes, outs)
    other = 1 - bad_pid
    assert codes[bad_pid] == 2 and error in outs[bad_pid], outs[bad_pid][-2000:]
    assert codes[other] not in (0, None), outs[other][-2000:]
    assert f"process {bad_pid} failed: {error}" in outs[other], outs[other][-2000:]
