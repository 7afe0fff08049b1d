"""Steps whose loss or gradient norm is not finite: never saved, and either the end of the run or
skipped.

The train step itself applies no update when its loss or gradient norm is not finite
(``steps.make_train_step``: parameters and optimizer state stay as they were, so a non-finite value
never reaches the state). The loop learns of it here, one step late so that the device is never
left waiting for the host, and always before a checkpoint is written: with ``skip_nonfinite=0`` the
run stops with one line naming the step, the last good step and its newest checkpoint; with ``N >
0`` the step is skipped, as large runs do (PaLM, Chowdhery et al. 2022, skipped batches around loss
spikes), and only ``N + 1`` such steps in a row stop the run.
"""

from __future__ import annotations

from typing import Any

import jax


class NonFiniteError(FloatingPointError):
    """A step's loss or gradient norm was not finite and the run stopped; nothing from that step
    was saved. ``python -m train`` prints it as one ``training stopped: ...`` line."""


class FiniteCheck:
    """Reads every step's ``ok`` flag (``metrics["ok"]``) and stops or skips the bad steps."""

    def __init__(self, skip: int, ckpt: Any, log: Any):
        self.skip, self.ckpt, self.log = skip, ckpt, log
        self.pending: list[tuple[int, Any]] = []
        self.in_a_row, self.skipped = 0, 0

    def add(self, step: int, metrics: dict) -> None:
        """Queues ``step``'s flag and reads every older one (the newest stays in flight)."""
        self.pending.append((step, metrics))
        self._resolve(keep=1)

    def settle(self) -> None:
        """Reads every queued flag: before a checkpoint, an evaluation and the end of the run."""
        self._resolve(keep=0)

    def _resolve(self, keep: int) -> None:
        while len(self.pending) > keep:
            step, metrics = self.pending.pop(0)
            m = jax.device_get({k: metrics[k] for k in ("ok", "loss", "grad_norm")})
            if bool(m["ok"]):
                self.in_a_row = 0
                continue
            self.in_a_row, self.skipped = self.in_a_row + 1, self.skipped + 1
            values = f"loss={float(m['loss'])} grad_norm={float(m['grad_norm'])}"
            if self.in_a_row <= self.skip:
                self.log(
                    f"step {step}: {values} is not finite; its update was skipped "
                    f"({self.in_a_row} in a row, skip_nonfinite={self.skip})"
                )
                continue
            raise NonFiniteError(self._message(step, values))

    def _message(self, step: int, values: str) -> str:
        self.ckpt.wait()  # a save still being written is complete (and listed) once this returns
        saved = [s for s in self.ckpt.steps() if s < step]
        first = step - self.in_a_row + 1
        what = (
            f"step {step}: {values} is not finite"
            if self.in_a_row == 1
            else f"steps {first}-{step} had a non-finite loss or gradient norm ({values} at "
            f"step {step}; skip_nonfinite={self.skip})"
        )
        where = (
            f"its newest checkpoint is step {saved[-1]} in {self.ckpt.directory!r}: relaunch "
            "to resume from it"
            if saved
            else "no checkpoint was saved before it: start again"
        )
        if saved and saved[-1] >= first:  # checkpoints of skipped steps: their updates never ran
            where += f" (steps {first}-{saved[-1]} were skipped: no update of theirs is in it)"
        return (
            f"{what}; no update from {'it' if first == step else 'them'} was saved. The last good "
            f"step is {first - 1} and "
            f"{where}, with a smaller optim.lr, optim.clip_norm > 0, or skip_nonfinite=N to "
            "skip such steps"
        )
