"""Loading the training configuration: YAML files and presets with ``--a.b=c`` overrides, into the
frozen dataclasses of ``train/config_schema.py`` (re-exported here: ``config.TrainConfig``,
``config.check``, the sections).

Every option carries its documentation (``--help`` prints all of them). Unknown keys raise a
``ValueError`` that lists the valid ones; values are checked against the field's type, never
silently converted. This module imports neither jax nor the model, so ``python -m train`` can
read the config (e.g. ``cpu_devices``) before jax starts. ``stage_configs`` expands the progressive
context schedule of Large World Model (Liu, Yan, Zaharia & Abbeel 2024).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any

import yaml

from train.config_schema import (
    XLA_DETERMINISTIC,
    CheckpointSection,
    DataSection,
    DistributedSection,
    EvalSection,
    LogSection,
    MeshSection,
    ModelSection,
    OptimSection,
    ResumeSection,
    SampleSection,
    StageSection,
    TrainConfig,
    _hints,
    check,
    get,
    opt,
    xla_deterministic,
)

__all__ = [
    "XLA_DETERMINISTIC",
    "CheckpointSection",
    "ConfigError",
    "DataSection",
    "DistributedSection",
    "EvalSection",
    "LogSection",
    "MeshSection",
    "ModelSection",
    "OptimSection",
    "ResumeSection",
    "SampleSection",
    "StageSection",
    "TrainConfig",
    "build",
    "check",
    "get",
    "help_text",
    "load",
    "load_launch",
    "opt",
    "parse_overrides",
    "preset_dirs",
    "preset_path",
    "presets",
    "stage_configs",
    "to_dict",
    "xla_deterministic",
    "yaml_load",
]


class ConfigError(ValueError):
    """A setting that cannot work, found while setting up a run (mesh, data, shapes). ``python -m
    train`` prints it as one ``config error: ...`` line, like the mistakes found while loading."""


class _Loader(yaml.SafeLoader):
    """YAML loader that also reads ``1e6`` (no dot) as a float, as Python does."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def yaml_load(text: Any, where: str = "", option: bool = False) -> Any:
    """``yaml.safe_load`` that reads ``1e6`` as a float. A syntax error is a ValueError naming
    ``where`` (``file:line:column``, or the ``option`` and the column)."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = " ".join((getattr(e, "problem", None) or str(e)).split())
        if option:
            at = f" (column {mark.column + 1})" if mark is not None else ""
            raise ValueError(f"{where} is not valid YAML{at}: {problem}") from None
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise ValueError(f"{where or 'YAML'}{at}: invalid YAML: {problem}") from None


def _check_type(value: Any, tp: Any, key: str) -> Any:
    """Returns ``value`` converted to ``tp`` (nested dataclasses, lists), or raises TypeError."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"{key} must be a mapping of {tp.__name__} options; got {value!r}")
        return build(tp, value, prefix=key + ".")
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _check_type(value, arg, key)
            except TypeError:
                pass
        raise TypeError(f"{key}={value!r} does not match {tp}")
    if origin is list or tp is list:
        if not isinstance(value, list):
            raise TypeError(f"{key} must be a list; got {value!r}")
        (item,) = typing.get_args(tp) or (Any,)
        return [_check_type(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is Any or tp is type(None) and value is None:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is dict and isinstance(value, dict):
        return dict(value)
    if isinstance(tp, type) and isinstance(value, tp):
        if not (tp is int and isinstance(value, bool)):
            return value
    raise TypeError(f"{key}={value!r} must be of type {getattr(tp, '__name__', tp)}")


def build(cls, values: dict, prefix: str = "") -> Any:
    """Builds dataclass ``cls`` from a nested dict, rejecting unknown keys and wrong types."""
    hints = _hints(cls)
    unknown = sorted(set(values) - set(hints))
    if unknown:
        valid = ", ".join(prefix + k for k in hints)
        raise ValueError(f"unknown config key(s) {[prefix + k for k in unknown]}; valid keys: {valid}")
    kwargs = {k: _check_type(v, hints[k], prefix + k) for k, v in values.items()}
    return cls(**kwargs)


def to_dict(config: Any) -> Any:
    """A nested plain-dict copy of a config (YAML/JSON serialisable)."""
    return dataclasses.asdict(config)


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ValueError(f"override --{key}: {p!r} is not a section")
        node = child
    node[parts[-1]] = value


def parse_overrides(args: Sequence[str]) -> list[tuple[str, Any]]:
    """``["--a.b=1", "--c", "x"]`` -> ``[("a.b", 1), ("c", "x")]`` with YAML-typed values."""
    out, i = [], 0
    args = list(args)
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ValueError(f"expected --key=value, got {arg!r}")
        if "=" in arg:
            key, raw = arg[2:].split("=", 1)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            key, raw = arg[2:], args[i + 1]
            i += 1
        else:
            raise ValueError(f"option {arg!r} has no value; write {arg}=VALUE")
        out.append((key, yaml_load(raw, f"--{key}={raw}", option=True) if raw != "" else ""))
        i += 1
    return out


def load(path: str | None, overrides: Sequence[str] = ()) -> TrainConfig:
    """Reads a YAML config (None: all defaults) and applies ``--dotted.key=value`` overrides."""
    values: dict = {}
    if path is not None:
        path = preset_path(path)
        values = _read_yaml(path)
        if not isinstance(values, dict):
            raise ValueError(f"config file {path!r} must hold a mapping, got {type(values).__name__}")
    for key, value in parse_overrides(overrides):
        _check_key(key)
        _set_dotted(values, key, value)
    return build(TrainConfig, values)


def preset_dirs() -> list[pathlib.Path]:
    """Where the preset YAMLs live: the checkout's ``configs/`` and, installed from a wheel,
    ``<prefix>/share/ringattention/configs`` (pyproject's data-files) of the environment or of the
    prefix holding this package (``pip install --prefix/--user``: <prefix>/lib/pythonX.Y/...)."""
    here = pathlib.Path(__file__).resolve()
    share = ("share", "ringattention", "configs")
    return [
        here.parents[1] / "configs",
        pathlib.Path(sys.prefix).joinpath(*share),
        here.parents[4].joinpath(*share) if len(here.parents) > 4 else here.parents[1],
    ]


def presets() -> list[str]:
    """Names of the preset configs found in :func:`preset_dirs`."""
    return sorted({p.stem for d in preset_dirs() if d.is_dir() for p in d.glob("*.yaml")})


def preset_path(path: str) -> str:
    """``path`` itself if it exists (or is a URL); else the preset it names (``debug``,
    ``debug.yaml`` or ``configs/debug.yaml``) in :func:`preset_dirs`. FileNotFoundError naming the
    path and the presets when neither exists (other paths are returned as they are)."""
    if "://" in path or pathlib.Path(path).exists():
        return path
    if pathlib.Path(path).parent not in (pathlib.Path("."), pathlib.Path("configs")):
        return path  # a path elsewhere: its own "does not exist"
    name = pathlib.Path(path).name
    name = name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"
    for d in preset_dirs():
        if (d / name).is_file():
            return str(d / name)
    raise FileNotFoundError(f"config file {path!r} does not exist and names no preset; presets: {presets()}")


def _read_yaml(path: str) -> Any:
    """The YAML document of file ``path`` ({} when empty); errors name the file."""
    import fsspec

    try:
        with fsspec.open(path, "r", encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {path!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"config file {path!r} cannot be read: {e}") from None
    return yaml_load(text, path) or {}


def load_launch(path: str | None, overrides: Sequence[str] = ()) -> tuple[DistributedSection, int]:
    """``(distributed section, cpu_devices)`` of a config whose other options may be wrong: what a
    process of a multi-process job needs to join the others and tell them its error."""
    values: dict = {}
    if path is not None:
        path = preset_path(path)
        values = _read_yaml(path)
    try:
        pairs = parse_overrides(overrides)
    except ValueError:  # keep the --key=value ones that parse
        pairs = [p for a in overrides if "=" in a for p in parse_overrides([a])]
    for key, value in pairs:
        if key.startswith("distributed.") or key == "cpu_devices":
            _set_dotted(values, key, value)
    section = build(DistributedSection, values.get("distributed") or {}, prefix="distributed.")
    cpu = values.get("cpu_devices", 0)
    return section, cpu if isinstance(cpu, int) and cpu > 0 else 0


def _check_key(key: str) -> None:
    # Fail on a misspelt override with the list of valid keys (model.overrides.* is free-form).
    cls, prefix = TrainConfig, ""
    for part in key.split("."):
        hints = _hints(cls)
        if part not in hints:
            valid = ", ".join(prefix + k for k in hints)
            raise ValueError(f"unknown config key {key!r}; valid keys: {valid}")
        tp, prefix = hints[part], prefix + part + "."
        if not dataclasses.is_dataclass(tp):
            return
        cls = tp


def help_text(cls=TrainConfig, prefix: str = "", indent: str = "  ") -> str:
    """One line per option: ``--key (type, default): doc``, nested sections flattened."""
    lines = []
    for f in dataclasses.fields(cls):
        tp = _hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            lines.append(f"\n[{prefix}{f.name}] {f.metadata['doc']}")
            lines.append(help_text(tp, prefix + f.name + ".", indent))
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        name = getattr(tp, "__name__", str(tp))
        lines.append(f"{indent}--{prefix}{f.name} ({name}, default {default!r}): {f.metadata['doc']}")
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
        if dataclasses.is_dataclass(item):
            lines.append(f"{indent}  keys of each {prefix}{f.name} item:")
            lines.append(help_text(item, "", indent + "    "))
    return "\n".join(lines)


def stage_configs(config: TrainConfig) -> list[TrainConfig]:
    """The config of every stage (one stage, ``config`` itself, when no stages are given)."""
    if not config.stages:
        return [config]
    out = []
    for i, stage in enumerate(config.stages):
        data, optim, model = config.data, config.optim, config.model
        if stage.seq_len:
            data = dataclasses.replace(data, seq_len=stage.seq_len)
        if stage.batch_size:
            data = dataclasses.replace(data, batch_size=stage.batch_size)
        if stage.lr:
            optim = dataclasses.replace(optim, lr=stage.lr)
        over = {"rope_theta": stage.rope_theta, "remat": stage.remat}
        over = {k: v for k, v in over.items() if v}
        if over:
            model = dataclasses.replace(model, overrides={**model.overrides, **over})
        out.append(
            dataclasses.replace(
                config,
                run_dir=f"{config.run_dir.rstrip('/')}/stage_{i}",
                steps=stage.steps,
                data=data,
                optim=optim,
                model=model,
                stages=[],
            )
        )
    return out
