"""What a resumed run may change, and how its run directory stays consistent.

``run_dir/config.yaml`` is the config the run was started with. On resume the new config is
compared with it, option by option: a change to the data stream or the model (``GUARDED``: data,
model, mesh, gradient accumulation, deterministic kernels) is refused in one line listing the
differences unless ``resume.allow_changes`` says so; any accepted change is printed and recorded in
``config.yaml``, which then holds the new config after comment lines listing every change and the
step it was made at. Per-launch options (``VOLATILE``) are not compared. ``steps`` (or ``stop_at``)
at or below the resumed step is an error, except when that step's final evaluation is missing (a
run stopped after its last checkpoint): it then runs alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fsspec
import jax
import yaml

from train import config as config_lib
from train.config import ConfigError

GUARDED = ("data.", "model.", "mesh.", "optim.accum_steps", "deterministic")
VOLATILE = ("run_dir", "stop_at", "checkpoint.resume", "resume.")
HISTORY = "# resumed at step "  # the comment lines of config.yaml that record changes


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists are values)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def changes(saved: dict, new: dict) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (saved value, new value)}`` of the options that differ, volatile ones
    excepted; a key missing on one side (an option added since) reads as absent."""
    a, b = flatten(saved), flatten(new)
    keys = sorted(set(a) | set(b))
    out = {
        k: (a.get(k, "<absent>"), b.get(k, "<absent>"))
        for k in keys
        if a.get(k, "<absent>") != b.get(k, "<absent>")
    }
    return {k: v for k, v in out.items() if not k.startswith(VOLATILE)}


def _describe(diff: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in diff.items())


def _config_path(run_dir: str) -> str:
    return f"{run_dir.rstrip('/')}/config.yaml"


def read_saved(run_dir: str) -> tuple[dict | None, list[str]]:
    """(the saved config as a dict, its history comment lines); (None, []) without config.yaml."""
    fs, path = fsspec.core.url_to_fs(_config_path(run_dir))
    if not fs.exists(path):
        return None, []
    with fs.open(path, "r") as f:
        text = f.read()
    history = [line for line in text.splitlines() if line.startswith(HISTORY)]
    return config_lib.yaml_load(text, _config_path(run_dir)) or {}, history


def write_config(config: config_lib.TrainConfig, history: list[str] = ()) -> None:
    """Writes ``run_dir/config.yaml`` (process 0): the history comment lines, then the config."""
    if jax.process_index() != 0:
        return
    fs, path = fsspec.core.url_to_fs(config.run_dir)
    fs.makedirs(path, exist_ok=True)
    with fs.open(_config_path(path), "w") as f:
        f.writelines(line + "\n" for line in history)
        yaml.safe_dump(config_lib.to_dict(config), f, sort_keys=False)


def check_changes(config: config_lib.TrainConfig, step: int, log: Callable[[str], Any]) -> Callable[[], None]:
    """Compares ``config`` with the run's ``config.yaml`` before step ``step`` is resumed: raises
    ConfigError on a guarded change unless ``resume.allow_changes``. Returns the function that
    records accepted changes in ``config.yaml``, to be called once the checkpoint is restored (a
    failed restore records nothing, so the unchanged config still resumes)."""
    saved, history = read_saved(config.run_dir)
    if saved is None:  # a run directory from before config.yaml existed: start its record now
        return lambda: write_config(config)
    diff = changes(saved, config_lib.to_dict(config))
    if not diff:
        return lambda: None
    guarded = {k: v for k, v in diff.items() if k.startswith(GUARDED)}
    if guarded and not config.resume.allow_changes:
        raise ConfigError(
            f"run_dir {config.run_dir!r} holds step {step} of a run with other data or model "
            f"options: {_describe(guarded)} (saved -> now). Use a new run_dir, or pass "
            "--resume.allow_changes=true to go on with them (config.yaml records the change)"
        )
    log(f"resuming step {step} with changed options: {_describe(diff)}")
    return lambda: write_config(config, [*history, f"{HISTORY}{step}: {_describe(diff)}"])


def check_steps(
    config: config_lib.TrainConfig, start: int, stop: int, final_eval_missing: bool, done_ok: bool
) -> None:
    """Raises ConfigError when there is nothing to do from ``start``: ``stop`` (steps or stop_at)
    below it, or equal to it with the final evaluation done (``done_ok``: a finished stage of a
    progressive schedule, passed on)."""
    if start < stop or start == stop and (final_eval_missing or done_ok):
        return
    which = f"stop_at={config.stop_at}" if stop < config.steps else f"steps={config.steps}"
    raise ConfigError(
        f"{which} but run_dir {config.run_dir!r} already holds step {start}: nothing to train. "
        f"Raise steps above {start} to train further (the learning-rate schedule then runs to the "
        "new steps), resume an older step with --checkpoint.resume=STEP, or use a new run_dir"
    )
