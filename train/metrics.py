"""Training metrics: JSONL in the run directory, TensorBoard event files, throughput and MFU.

MFU (model FLOPs utilisation, PaLM, Chowdhery et al. 2022) = achieved model FLOP/s over the devices'
peak dense FLOP/s; the model FLOPs per token come from ``models.llama.flops_per_token``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import fsspec

# Peak dense bf16 TFLOP/s per device, matched by substring of ``device.device_kind`` (lower case).
PEAK_TFLOPS = (
    ("h200", 989.0), ("h100", 989.0), ("gh200", 989.0), ("a100", 312.0), ("l4", 121.0),
    ("b200", 2250.0), ("v6", 918.0), ("v5p", 459.0), ("v5 lite", 197.0), ("v5e", 197.0),
    ("v4", 275.0), ("cpu", 0.1),  # cpu: a nominal figure, MFU on CPU is only indicative
)


def peak_tflops(device_kind: str, override: float = 0.0) -> float:
    """Peak TFLOP/s per device: ``override`` if > 0, else looked up from ``device_kind``."""
    if override > 0:
        return override
    kind = device_kind.lower()
    for name, tflops in PEAK_TFLOPS:
        if name in kind:
            return tflops
    return float("nan")


def mfu(flops_per_token: float, tokens_per_sec: float, num_devices: int, peak: float) -> float:
    """Fraction of the devices' peak that the model's FLOPs use (NaN when the peak is unknown)."""
    return flops_per_token * tokens_per_sec / (num_devices * peak * 1e12)


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
