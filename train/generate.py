"""Text generation and the needle test from a training run directory.

``models.generate`` / ``models.needle`` read Hugging Face directories and presets; reading a run
directory (its ``config.yaml``, newest complete checkpoint and tokenizer) needs the training side, so
it lives here and imports point one way (train -> models -> ringattention)::

    python -m train.generate --run_dir runs/debug --prompt "And God said" [models.generate options]
    python -m train.generate needle --run_dir runs/debug --out DIR [models.needle options]
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import Mesh

from models import generate as gen
from models import llama, needle
from models.cli import run
from models.config import LlamaConfig
from models.tokenizer import Tokenizer, get_tokenizer
from train import config as config_lib
from train import steps
from train.checkpoint import Checkpointer, CheckpointError


def load_run(
    run_dir: str, mesh: Mesh | None = None, step: int | None = None, **overrides: Any
) -> tuple[LlamaConfig, Any, Tokenizer]:
    """(LlamaConfig, params, tokenizer) of a training run: its config with LlamaConfig
    ``overrides``, the parameters of checkpoint ``step`` (default: the newest complete one)."""
    run_dir = run_dir.rstrip("/")
    if os.path.basename(run_dir) == "checkpoints":
        run_dir = os.path.dirname(run_dir)
    cfg = config_lib.load(f"{run_dir}/config.yaml")
    config = steps.model_config(cfg, **overrides)
    ckpt = Checkpointer(f"{run_dir}/checkpoints", keep=1, async_save=False, read_only=True)
    step = ckpt.latest() if step is None else step
    if step is None:
        raise FileNotFoundError(f"no complete checkpoint under {run_dir}/checkpoints")
    if mesh is None:
        dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        like = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=dev), llama.abstract_params(config)
        )
    else:
        like = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            llama.abstract_params(config),
            llama.param_shardings(config, mesh),
        )
    params = ckpt.restore(step, like)["params"]
    ckpt.close()
    return config, params, get_tokenizer(cfg.data.tokenizer, cfg.data.tokenizer_path)


def main(argv: Sequence[str] | None = None) -> list[str] | dict:
    """``[needle] --run_dir DIR ...``: the generation CLI, or the needle test with ``needle``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["needle"]:
        return needle.main(argv[1:], load_run=load_run, prog="python -m train.generate needle")
    return gen.main(argv, load_run=load_run, prog="python -m train.generate")


def cli(argv: Sequence[str] | None = None) -> int:
    """``main`` as a command: a user error (bad option, missing or damaged run) is one line on
    stderr and exit status 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = "python -m train.generate" + (" needle" if argv[:1] == ["needle"] else "")
    return run(main, prog, argv, errors=(CheckpointError,))


if __name__ == "__main__":
    sys.exit(cli())
