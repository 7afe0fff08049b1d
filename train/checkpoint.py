"""Sharded, asynchronous, keep-last-k checkpoints with orbax-checkpoint.

One checkpoint holds three items: ``params``; ``train`` (optimizer state, rng key data and the
``[accum, rows, 3]`` data position, sharded like the batch); and ``meta`` (JSON: step and config).
Orbax writes a step into a temporary directory and renames it only once every process has
finished, so an interrupted save is never listed and resume picks the newest *complete* step; a
step directory without orbax's commit marker is moved aside, not deleted. Parameters can be
restored alone (the next stage of a progressive context schedule, LWM, Liu et al. 2024).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

ITEMS = ("params", "train", "meta")
COMMIT = "commit_success.txt"  # orbax writes it when a step is complete


class CheckpointError(RuntimeError):
    """A checkpoint that was asked for is missing or cannot be read."""


def _abstract(tree: Any) -> Any:
    def one(x):
        return x if isinstance(x, jax.ShapeDtypeStruct) else ocp.utils.to_shape_dtype_struct(x)

    return jax.tree.map(one, tree)


def _quiet_hook(previous: Callable[[Any], None]) -> Callable[[Any], None]:
    """An ``sys.unraisablehook`` that drops the reports of orbax's abandoned parallel reads and
    passes every other report to ``previous``."""

    def hook(unraisable) -> None:
        exc, code = unraisable.exc_value, getattr(unraisable.object, "cr_code", None)
        closed = isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
        if closed or "orbax" in getattr(code, "co_filename", ""):
            return
        previous(unraisable)

    hook.quiet_failed_reads = True
    return hook


def quiet_failed_reads() -> None:
    """After a restore fails, orbax's other reads of that step fail one by one once its event loop
    has closed, each reported as an unraisable exception (pages of tracebacks and TensorStore specs
    around the one error that matters): from now on, those reports are dropped."""
    if not getattr(sys.unraisablehook, "quiet_failed_reads", False):
        sys.unraisablehook = _quiet_hook(sys.unraisablehook)


class Checkpointer:
    """Saves and restores training state under ``directory`` (local path or fsspec/gcs URL)."""

    def __init__(self, directory: str, *, keep: int, async_save: bool, read_only: bool = False):
        if "://" not in directory:
            directory = os.path.abspath(directory)  # orbax needs absolute local paths
        self.directory = directory
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=not read_only,
            read_only=read_only,
            enable_async_checkpointing=async_save,
            save_interval_steps=1,
        )
        self._manager = ocp.CheckpointManager(directory, options=options, item_names=ITEMS)
        if not read_only:
            self._set_aside_incomplete()

    def _set_aside_incomplete(self) -> None:
        # A step directory without the commit marker is an interrupted save (on filesystems where
        # orbax commits by marker). Rename it out of orbax's way, keeping its files.
        root = self._manager.directory
        bad = [s for s in self._manager.all_steps() if not (root / str(s) / COMMIT).exists()]
        if bad and jax.process_index() == 0:
            for s in bad:
                target = root / f"incomplete.{s}.{int(time.time())}"
                logging.warning("checkpoint step %d in %s is incomplete; moved to %s", s, root, target)
                (root / str(s)).rename(target)
        if bad:
            if jax.process_count() > 1:
                multihost_utils.sync_global_devices("train.checkpoint.set_aside")
            self._manager.reload()

    def steps(self) -> list[int]:
        """Complete checkpoints, oldest first: orbax lists a step once it is renamed from its
        temporary directory, and writes ``commit_success.txt`` into it last (on any filesystem)."""
        self._manager.reload()
        root = self._manager.directory
        return sorted(s for s in self._manager.all_steps() if (root / str(s) / COMMIT).exists())

    def latest(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def meta(self, step: int) -> dict:
        """The ``meta`` item of ``step`` alone (its step and config); {} where it cannot be read
        (``restore`` then names the problem)."""
        try:
            return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        except Exception:  # noqa: BLE001 - any damage is reported by restore
            return {}

    def save(self, step: int, params: Any, train: Any, meta: dict) -> None:
        """Starts saving ``step`` (returns before the write finishes when async)."""
        args = ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            train=ocp.args.StandardSave(train),
            meta=ocp.args.JsonSave(meta),
        )
        self._manager.save(step, args=args, force=True)

    def restore(self, step: int, params_like: Any, train_like: Any | None = None) -> dict:
        """Restores ``step`` into the structure, shapes and shardings of the ``*_like`` trees.

        ``train_like`` None restores only params and meta. Raises CheckpointError on a missing or
        unreadable step, naming it; nothing on disk is changed.
        """
        if step not in self.steps():
            raise CheckpointError(
                f"no complete checkpoint for {step=} in {self.directory!r}; complete steps: {self.steps()}"
            )
        items = {"params": ocp.args.StandardRestore(_abstract(params_like)), "meta": ocp.args.JsonRestore()}
        if train_like is not None:
            items["train"] = ocp.args.StandardRestore(_abstract(train_like))
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:  # orbax/tensorstore raise many types for damaged files
            quiet_failed_reads()
            older = [s for s in self.steps() if s < step]
            options = (
                f"resume an older complete step {older} with checkpoint.resume=STEP (e.g. "
                f"--checkpoint.resume={older[-1]}; newer steps are then set aside, not "
                "deleted)"
                if older
                else "there is no older complete step"
            )
            cause = " ".join(str(e).split("See full TensorStore details")[0].split())[:300]
            raise CheckpointError(
                f"checkpoint {step=} in {self.directory!r} is corrupt or does not match this "
                f"config ({type(e).__name__}: {cause}). It was left untouched; fix the config, "
                f"{options}, or start a new run_dir."
            ) from e
        return {k: out[k] for k in items}

    def set_aside_after(self, step: int) -> list[int]:
        """Renames the directories of complete steps newer than ``step`` to
        ``superseded.<step>.<time>`` (files kept), so that training can go on from ``step``."""
        newer = [s for s in self.steps() if s > step]
        root = self._manager.directory
        if newer and jax.process_index() == 0:
            for s in newer:
                target = root / f"superseded.{s}.{int(time.time())}"
                logging.warning(
                    "checkpoint step %d in %s is newer than the resumed step %d; moved to %s",
                    s,
                    root,
                    step,
                    target,
                )
                (root / str(s)).rename(target)
        if newer:
            if jax.process_count() > 1:
                multihost_utils.sync_global_devices("train.checkpoint.set_aside_after")
            self._manager.reload()
        return newer

    def wait(self) -> None:
        """Blocks until pending async saves are written and committed."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves (so they commit), then releases the manager; idempotent."""
        if self._manager is not None:
            self._manager.wait_until_finished()
            self._manager.close()
            self._manager = None

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
