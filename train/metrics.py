"""Training metrics: JSONL in the run directory, TensorBoard event files, throughput and MFU.

MFU (model FLOPs utilisation, PaLM, Chowdhery et al. 2022) = the model FLOPs of the batches trained
in a logging window, counted from their documents (``models.flops.batch_flops``: attention only
within each packed document, as the kernels compute it), per second, over the devices' datasheet
dense bf16 peak (``models.flops.peak_tflops``: H100 and H200 989 TFLOP/s each, as PaLM, MaxText,
Megatron and TRL divide), never a measured rate. Every record carries ``flops_per_token`` (counted),
``peak_tflops`` and ``peak_source`` ("datasheet"; "nominal" on a CPU, "config" for
``log.peak_tflops``).
"""

from __future__ import annotations

import json
import math
from typing import Any

import fsspec

from models.flops import Peak, mfu, peak_tflops  # noqa: F401  (the training loop's names for them)


def _clean(value: Any) -> Any:
    # JSON has no NaN/inf: write them as null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Appends one JSON object per record to ``run_dir/metrics.jsonl`` (+ TensorBoard scalars).

    Only the primary process writes; others construct a no-op writer.
    """

    def __init__(self, run_dir: str, *, tensorboard: bool, primary: bool):
        self.primary = primary
        self.path = f"{run_dir.rstrip('/')}/metrics.jsonl"
        self._tb = None
        if primary and tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(f"{run_dir.rstrip('/')}/tensorboard")

    def write(self, record: dict[str, Any], prefix: str = "train") -> None:
        if not self.primary:
            return
        record = {k: _clean(v) for k, v in record.items()}
        with fsspec.open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self._tb is not None:
            step = int(record["step"])
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(f"{prefix}/{k}", v, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    """All records of ``run_dir/metrics.jsonl`` (an empty list if there is none)."""
    fs, path = fsspec.core.url_to_fs(f"{run_dir.rstrip('/')}/metrics.jsonl")
    if not fs.exists(path):
        return []
    with fs.open(path, "r") as f:
        return [json.loads(line) for line in f if line.strip()]


def drop_after(run_dir: str, step: int) -> int:
    """Removes the records of steps after ``step`` from ``run_dir/metrics.jsonl`` (a resumed run
    writes them again, so that no step is there twice); returns how many were removed."""
    records = read_metrics(run_dir)
    keep = [r for r in records if r.get("step", 0) <= step]
    if len(keep) == len(records):
        return 0
    with fsspec.open(f"{run_dir.rstrip('/')}/metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in keep)
    return len(records) - len(keep)


def has_eval(run_dir: str, step: int) -> bool:
    """Whether ``run_dir/metrics.jsonl`` holds an evaluation of ``step``."""
    return any(r.get("step") == step and "eval_loss" in r for r in read_metrics(run_dir))
