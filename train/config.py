"""Typed training configuration: frozen dataclasses loaded from YAML with ``--a.b=c`` overrides.

Every option carries its documentation (``--help`` prints all of them). Unknown keys raise a
``ValueError`` that lists the valid ones; values are checked against the field's type, never
silently converted. This module imports neither jax nor the model, so ``python -m train`` can
read the config (e.g. ``cpu_devices``) before jax starts. The progressive context schedule follows
Large World Model (Liu, Yan, Zaharia & Abbeel 2024).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any

import yaml

XLA_DETERMINISTIC = "--xla_gpu_deterministic_ops=true"  # XLA's GPU scatters, reductions, GEMMs


class ConfigError(ValueError):
    """A setting that cannot work, found while setting up a run (mesh, data, shapes). ``python -m
    train`` prints it as one ``config error: ...`` line, like the mistakes found while loading."""


def xla_deterministic(flags: str) -> bool:
    """Whether the XLA_FLAGS string ``flags`` makes XLA's GPU ops deterministic (the last setting of
    --xla_gpu_deterministic_ops or --xla_gpu_exclude_nondeterministic_ops wins)."""
    on = False
    for token in flags.split():
        name, _, value = token.partition("=")
        if name in ("--xla_gpu_deterministic_ops", "--xla_gpu_exclude_nondeterministic_ops"):
            on = value.lower() in ("", "true", "1")
    return on


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


def opt(default: Any, doc: str) -> Any:
    """A dataclass field with documentation; mutable defaults are copied per instance."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"doc": doc})
    return dataclasses.field(default=default, metadata={"doc": doc})


@dataclasses.dataclass(frozen=True)
class ModelSection:
    preset: str = opt("debug", "Preset name in models.PRESETS (debug, 1b, 3b, 7b, 8b, 70b).")
    overrides: dict = opt(
        {},
        "LlamaConfig fields replacing the preset's, e.g. {rope_theta: 1e6, "
        "layout: zigzag, dtype: bfloat16, remat: full}.",
    )
    init_from: str = opt(
        "", "Hugging Face checkpoint directory to start from (models.llama.load_hf); empty: random init."
    )


@dataclasses.dataclass(frozen=True)
class MeshSection:
    dp: int = opt(1, "Data-parallel axis size (-1: all remaining devices).")
    fsdp: int = opt(1, "Fully sharded data-parallel axis size (-1: all remaining devices).")
    tp: int = opt(1, "Tensor-parallel axis size (-1: all remaining devices).")
    sp: int = opt(1, "Sequence-parallel (ring) axis size (-1: all remaining devices).")
    usp: int = opt(
        1,
        "Ulysses sequence-parallel axis size (-1: all remaining devices): the sequence "
        "is split over sp x usp and attention exchanges heads over usp around the "
        "ring (2-D context parallelism; heads / tp must divide by usp).",
    )


@dataclasses.dataclass(frozen=True)
class DataSection:
    paths: list = opt(
        [],
        "Text (.txt) or JSONL (.jsonl, .jsonl.gz) files or globs, local or any "
        "fsspec URL; empty: the public-domain corpus shipped in "
        "train/corpus.",
    )
    format: str = opt(
        "auto",
        "auto (by extension), text (plain text: blank-line paragraphs "
        "gathered into documents of up to data.text_doc_chars) or jsonl.",
    )
    text_doc_chars: int = opt(
        8192,
        "Characters per document of a text file: its paragraphs are "
        "gathered into documents of at most this many (a longer "
        "paragraph is cut into pieces of it); 0: one document per file.",
    )
    text_key: str = opt("text", "JSONL field holding a document's text.")
    tokenizer: str = opt(
        "byte", "byte (UTF-8 bytes, vocab 256), hf (tokenizers JSON file) or sentencepiece (.model file)."
    )
    tokenizer_path: str = opt("", "Tokenizer file for tokenizer=hf or sentencepiece.")
    append_eos: bool = opt(True, "Append the tokenizer's EOS token to each document (if any).")
    seq_len: int = opt(256, "Tokens per packed sequence (global, before sharding over sp).")
    batch_size: int = opt(8, "Sequences per optimizer step, over all hosts and micro-batches.")
    eval_fraction: float = opt(0.05, "Fraction of documents held out for evaluation.")
    seed: int = opt(0, "Seed of the document shuffle (a new permutation every epoch).")


@dataclasses.dataclass(frozen=True)
class OptimSection:
    lr: float = opt(3e-4, "Peak learning rate (after warmup).")
    warmup_steps: int = opt(100, "Linear warmup steps from 0 to lr.")
    min_lr_ratio: float = opt(0.1, "Final learning rate of the cosine decay, as a fraction of lr.")
    b1: float = opt(0.9, "AdamW beta1.")
    b2: float = opt(0.95, "AdamW beta2.")
    eps: float = opt(1e-8, "AdamW epsilon.")
    weight_decay: float = opt(0.1, "Decoupled weight decay of matrices (never norms or biases).")
    decay_embeddings: bool = opt(False, "Also apply weight decay to the token embedding.")
    clip_norm: float = opt(1.0, "Global gradient norm clipping threshold (0: off).")
    accum_steps: int = opt(1, "Micro-batches accumulated per optimizer step (divides batch_size).")


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    every: int = opt(100, "Save every this many steps (and always at the last step; 0: only last).")
    keep: int = opt(3, "Keep the newest this many checkpoints.")
    async_save: bool = opt(True, "Write checkpoints in the background while training goes on.")
    resume: str | int = opt(
        "auto",
        "auto (resume the newest complete checkpoint in run_dir if "
        "any), never (refuse to start if run_dir has checkpoints), "
        "required, or a step number: resume that complete checkpoint "
        "(e.g. when the newest is damaged); newer ones are set aside.",
    )


@dataclasses.dataclass(frozen=True)
class ResumeSection:
    allow_changes: bool = opt(
        False,
        "Resume a run_dir whose config.yaml differs in options that "
        "change the data stream or the model (data, model, mesh, "
        "optim.accum_steps, deterministic); config.yaml then records "
        "the change (once the checkpoint is restored). A new "
        "data.batch_size starts its streams of documents afresh. Other "
        "changes are always accepted and recorded.",
    )


@dataclasses.dataclass(frozen=True)
class LogSection:
    every: int = opt(10, "Write metrics every this many steps.")
    tensorboard: bool = opt(True, "Also write TensorBoard event files to run_dir/tensorboard.")
    progress: bool = opt(True, "Show a progress bar with ETA (process 0 only).")
    peak_tflops: float = opt(
        0.0, "Datasheet dense bf16 TFLOP/s per device for MFU (0: the device's, models.flops.PEAK_TFLOPS)."
    )


@dataclasses.dataclass(frozen=True)
class EvalSection:
    every: int = opt(100, "Evaluate on the held-out split every this many steps (0: only at end).")
    batches: int = opt(4, "Batches per evaluation (fewer if the held-out split runs out).")


@dataclasses.dataclass(frozen=True)
class SampleSection:
    prompt: str = opt("In the beginning", "Prompt of the sample printed after training.")
    tokens: int = opt(64, "Tokens to generate (0: no sample).")
    temperature: float = opt(0.0, "Sampling temperature; 0 is greedy.")


@dataclasses.dataclass(frozen=True)
class DistributedSection:
    initialize: str = opt(
        "auto",
        "auto (when flags below or a SLURM/TPU environment say several "
        "processes), always, or never: jax.distributed.initialize().",
    )
    coordinator_address: str = opt("", "host:port of process 0's coordinator.")
    num_processes: int = opt(0, "Number of processes (0: from the environment).")
    process_id: int = opt(-1, "This process's id (-1: from the environment).")
    local_device_ids: list = opt([], "Devices this process uses (empty: all visible).")
    heartbeat_timeout: int = opt(
        30,
        "Seconds without a heartbeat after which the coordination "
        "service declares a process dead and ends the job.",
    )
    shutdown_timeout: int = opt(
        60, "Seconds a finishing process waits at the shutdown barrier for the others."
    )


@dataclasses.dataclass(frozen=True)
class StageSection:
    steps: int = opt(0, "Optimizer steps of this stage.")
    seq_len: int = opt(0, "data.seq_len of this stage (0: unchanged).")
    rope_theta: float = opt(0.0, "RoPE base of this stage (0: unchanged).")
    batch_size: int = opt(0, "data.batch_size of this stage (0: unchanged).")
    lr: float = opt(0.0, "optim.lr of this stage (0: unchanged).")
    remat: str = opt(
        "",
        "model remat policy of this stage ('': unchanged), e.g. offload_attn or "
        "full where the saved attention of save_attn no longer fits.",
    )


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    run_dir: str = opt("runs/debug", "Directory (local or fsspec) for checkpoints and metrics.")
    steps: int = opt(1000, "Optimizer steps (ignored when stages are given).")
    seed: int = opt(0, "Seed of parameter init and of the training rng.")
    stop_at: int = opt(
        0,
        "Stop after this step (checkpoint included) though the schedule runs to "
        "steps, e.g. to fit a job's time limit; a later launch resumes (0: off).",
    )
    skip_nonfinite: int = opt(
        0,
        "0: a step whose loss or gradient norm is not finite stops the "
        "run, naming the last good step (nothing from it is saved); N > 0: "
        "such a step's update is skipped and only N + 1 in a row stop.",
    )
    cpu_devices: int = opt(0, "Run on this many virtual CPU devices (0: the real devices).")
    deterministic: bool = opt(
        False,
        "Bitwise-reproducible runs (two runs, or a run stopped and "
        "resumed, give the same metrics): ring attention kernels whose "
        "sums have a fixed order (LlamaConfig.deterministic) and, on GPU, "
        f"XLA_FLAGS {XLA_DETERMINISTIC} (python -m "
        "train sets it before jax starts; a library "
        "caller must). Slower.",
    )
    model: ModelSection = opt(None, "Model.")
    mesh: MeshSection = opt(None, "Device mesh.")
    data: DataSection = opt(None, "Data.")
    optim: OptimSection = opt(None, "Optimizer.")
    checkpoint: CheckpointSection = opt(None, "Checkpoints.")
    resume: ResumeSection = opt(
        None, "What a resumed run may change (run_dir/config.yaml holds the run's config)."
    )
    log: LogSection = opt(None, "Metrics and logging.")
    eval: EvalSection = opt(None, "Evaluation.")
    sample: SampleSection = opt(None, "Sample printed at the end.")
    distributed: DistributedSection = opt(None, "Multi-host setup.")
    stages: list[StageSection] = opt(
        [],
        "Progressive context extension: stages run in order in "
        "run_dir/stage_<i>, each starting from the previous "
        "stage's final parameters.",
    )

    def __post_init__(self):
        hints = _hints(type(self))
        for f in dataclasses.fields(self):
            if dataclasses.is_dataclass(hints[f.name]) and getattr(self, f.name) is None:
                object.__setattr__(self, f.name, hints[f.name]())


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


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


_CHOICES = {
    "data.format": ("auto", "text", "jsonl"),
    "data.tokenizer": ("byte", "hf", "sentencepiece"),
    "checkpoint.resume": ("auto", "never", "required"),
    "distributed.initialize": ("auto", "always", "never"),
}
_POSITIVE = (
    "steps",
    "data.seq_len",
    "data.batch_size",
    "optim.accum_steps",
    "checkpoint.keep",
    "log.every",
    "eval.batches",
    "distributed.heartbeat_timeout",
    "distributed.shutdown_timeout",
)
_NON_NEGATIVE = (
    "stop_at",
    "skip_nonfinite",
    "data.text_doc_chars",
    "cpu_devices",
    "optim.warmup_steps",
    "checkpoint.every",
    "eval.every",
    "sample.tokens",
    "optim.lr",
    "optim.weight_decay",
    "optim.clip_norm",
    "sample.temperature",
    "log.peak_tflops",
)
# [low, high] or [low, high): the ratios of the schedule and AdamW's betas
_RANGES = {
    "optim.min_lr_ratio": (0.0, 1.0, "]"),
    "optim.b1": (0.0, 1.0, ")"),
    "optim.b2": (0.0, 1.0, ")"),
    "data.eval_fraction": (0.0, 1.0, ")"),
}


def get(config: Any, key: str) -> Any:
    for part in key.split("."):
        config = getattr(config, part)
    return config


def check(config: TrainConfig) -> None:
    """Raises ValueError on out-of-range or inconsistent options (before jax is touched)."""
    for key, choices in _CHOICES.items():
        if key == "checkpoint.resume" and isinstance(config.checkpoint.resume, int):
            if config.checkpoint.resume < 1:
                raise ValueError(
                    f"checkpoint.resume={config.checkpoint.resume} must be a step >= 1 or one of {choices}"
                )
            continue
        if get(config, key) not in choices:
            raise ValueError(f"{key}={get(config, key)!r}; choose one of {choices}")
    for key in _POSITIVE:
        if get(config, key) < 1:
            raise ValueError(f"{key}={get(config, key)!r} must be >= 1")
    for key in _NON_NEGATIVE:
        if get(config, key) < 0:
            raise ValueError(f"{key}={get(config, key)!r} must be >= 0")
    _check_finite(config, "")
    for key, (low, high, end) in _RANGES.items():
        value = get(config, key)
        if not (low <= value <= high if end == "]" else low <= value < high):
            raise ValueError(f"{key}={value!r} must be in [{low:g}, {high:g}{end}")
    if not config.optim.eps > 0:
        raise ValueError(f"optim.eps={config.optim.eps!r} must be > 0")
    if config.data.batch_size % config.optim.accum_steps:
        raise ValueError(
            f"data.batch_size={config.data.batch_size} is not divisible by "
            f"optim.accum_steps={config.optim.accum_steps}"
        )
    if "deterministic" in config.model.overrides:
        raise ValueError(
            "model.overrides.deterministic: set the top-level option deterministic "
            "instead (it also makes XLA's own GPU ops deterministic)"
        )
    if config.data.tokenizer != "byte" and not config.data.tokenizer_path:
        raise ValueError(f"data.tokenizer={config.data.tokenizer!r} needs data.tokenizer_path")
    for i, stage in enumerate(config.stages):
        if stage.steps < 1:
            raise ValueError(f"stages[{i}].steps={stage.steps} must be >= 1")
        for name in ("seq_len", "batch_size", "rope_theta", "lr"):
            if getattr(stage, name) < 0:
                raise ValueError(f"stages[{i}].{name}={getattr(stage, name)} must be >= 0")


def _check_finite(section: Any, prefix: str) -> None:
    """Every float option of ``section`` (and its subsections and stages) is finite."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            _check_finite(value, f"{prefix}{f.name}.")
        elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            for i, item in enumerate(value):
                _check_finite(item, f"{prefix}{f.name}[{i}].")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{prefix}{f.name}={value!r} must be a finite number")


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
