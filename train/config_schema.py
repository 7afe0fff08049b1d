"""The training configuration's schema: the frozen section dataclasses (``ModelSection`` ...
``StageSection``) and ``TrainConfig``, every option with its type, default and documentation
(``opt``), and ``check``, which rejects out-of-range or inconsistent options. Loading a config (YAML,
``--a.b=c`` overrides, presets, ``--help``) is ``train/config.py``, which re-exports these names, so
callers write ``config.TrainConfig`` and ``config.check``. This module imports neither jax nor the
model. The progressive context schedule (``StageSection``) follows Large World Model (Liu, Yan,
Zaharia & Abbeel 2024).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

XLA_DETERMINISTIC = "--xla_gpu_deterministic_ops=true"  # XLA's GPU scatters, reductions, GEMMs


def xla_deterministic(flags: str) -> bool:
    """Whether the XLA_FLAGS string ``flags`` makes XLA's GPU ops deterministic (the last setting of
    --xla_gpu_deterministic_ops or --xla_gpu_exclude_nondeterministic_ops wins)."""
    on = False
    for token in flags.split():
        name, _, value = token.partition("=")
        if name in ("--xla_gpu_deterministic_ops", "--xla_gpu_exclude_nondeterministic_ops"):
            on = value.lower() in ("", "true", "1")
    return on


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
