"""Multi-host start-up: ``jax.distributed.initialize`` from explicit flags or a SLURM / TPU launch.

Every process runs the same command and config; process 0 writes metrics and prints.

When one process of a job fails, the others would otherwise hang in a collective or wait at the
coordination service's shutdown barrier for minutes. ``python -m train`` therefore runs a
:class:`Watchdog` in every process: a failing process posts its error to the coordination service's
key-value store and waits (a few seconds at most) until the others have read it; every other process
polls the store, prints "process <i> failed: <error>" and exits non-zero at once. A process that
dies without posting (killed, out of memory) is caught by the service's heartbeat
(``distributed.heartbeat_timeout``); when process 0 (which hosts the service) dies, jax ends the
others at once.
"""

from __future__ import annotations

import inspect
import itertools
import json
import os
import sys
import threading
import time

from train.config import DistributedSection

KV_TIMEOUT_MS = 300_000  # how long process 0 waits for the others' values (they run in lockstep)
FAILED = "ringattention/failed/"  # + process id: that process's error
ACK = "ringattention/ack/"  # + failed id / reader id: the reader has seen it
POLL_S = 0.25  # how often the watchdog reads the store
ACK_WAIT_S = 10.0  # how long a failing process waits for the others to have read its error
EXIT_PEER_FAILED = 3  # exit status of a process stopped because another one failed
_SUMS = itertools.count()


def _env_says_multi_process() -> bool:
    if int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1:
        return True
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    if len([h for h in hosts.split(",") if h]) > 1:
        return True
    return bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))


def wants_initialize(cfg: DistributedSection) -> bool:
    """Whether this launch is one of several processes that must be connected."""
    if cfg.initialize == "never":
        return False
    if cfg.initialize == "always":
        return True
    return bool(cfg.coordinator_address) or cfg.num_processes > 1 or _env_says_multi_process()


def initialize(cfg: DistributedSection) -> bool:
    """Calls ``jax.distributed.initialize`` if needed (before other jax calls); True if it did."""
    if not wants_initialize(cfg):
        return False
    import jax

    kwargs = {}
    if cfg.coordinator_address:
        kwargs["coordinator_address"] = cfg.coordinator_address
    if cfg.num_processes > 0:
        kwargs["num_processes"] = cfg.num_processes
    if cfg.process_id >= 0:
        kwargs["process_id"] = cfg.process_id
    if cfg.local_device_ids:
        kwargs["local_device_ids"] = list(cfg.local_device_ids)
    if cfg.num_processes > 1 and (cfg.process_id < 0 or not cfg.coordinator_address):
        raise ValueError(
            f"distributed.num_processes={cfg.num_processes} needs "
            "distributed.coordinator_address and distributed.process_id"
        )
    if _initialized():
        return True
    accepted = inspect.signature(jax.distributed.initialize).parameters
    for name, value in (
        ("heartbeat_timeout_seconds", cfg.heartbeat_timeout),
        ("shutdown_timeout_seconds", cfg.shutdown_timeout),
    ):
        if name in accepted:
            kwargs[name] = value
    jax.distributed.initialize(**kwargs)
    return True


def _initialized() -> bool:
    from jax._src import distributed as jax_distributed

    return jax_distributed.global_state.client is not None


def start(cfg: DistributedSection) -> Watchdog | None:
    """``initialize`` and, for a multi-process job, a started :class:`Watchdog` (else None)."""
    if not initialize(cfg):
        return None
    import jax

    if jax.process_count() == 1:
        return None
    return Watchdog(_client(), jax.process_index(), jax.process_count())


def _stop(message: str, status: int) -> None:
    """Prints ``message`` to stderr and ends the process at once (no atexit handlers, no shutdown
    barrier: other threads may be blocked in a collective that will never complete)."""
    print(message, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(status)


class Watchdog:
    """Ends this process when another process of the job reports a failure (see the module
    docstring); :meth:`fail` reports this process's own failure and ends it."""

    def __init__(self, client, process_id: int, num_processes: int):
        self.client, self.pid, self.n = client, process_id, num_processes
        self.failing, self.stopped = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ringattention-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops watching (before a normal ``jax.distributed.shutdown``)."""
        self.stopped.set()
        self._thread.join()

    def _watch(self) -> None:
        acked: set[str] = set()
        while not self.stopped.wait(POLL_S):
            try:
                failures = [
                    (k, v) for k, v in self.client.key_value_dir_get(FAILED) if k != f"{FAILED}{self.pid}"
                ]
                for key, _ in failures:  # acknowledge every failure seen, once
                    if key not in acked:
                        self.client.key_value_set(f"{ACK}{key.rsplit('/', 1)[1]}/{self.pid}", "1")
                        acked.add(key)
            except Exception as e:  # noqa: BLE001 - the service is gone: process 0 has ended
                if not (self.failing.is_set() or self.stopped.is_set()):
                    _stop(
                        f"process {self.pid}: lost the coordination service on process 0 "
                        f"({' '.join(str(e).split())[:200]}); exiting",
                        EXIT_PEER_FAILED,
                    )
                return
            if failures and not self.failing.is_set():
                key, error = failures[0]
                if self.pid == 0:  # the service host ends last, after the others have exited
                    time.sleep(1.0)
                _stop(
                    f"process {self.pid}: stopping because process {key.rsplit('/', 1)[1]} failed: {error}",
                    EXIT_PEER_FAILED,
                )

    def fail(self, message: str, status: int) -> None:
        """Posts this process's error (already printed by the caller) for the others, waits until
        they have read it (at most ``ACK_WAIT_S``) and exits with ``status``."""
        self.failing.set()
        try:
            self.client.key_value_set(f"{FAILED}{self.pid}", f"{message[:2000]}")
            deadline = time.monotonic() + ACK_WAIT_S
            for p in range(self.n):
                left = deadline - time.monotonic()
                if p != self.pid and left > 0:
                    self.client.blocking_key_value_get(f"{ACK}{self.pid}/{p}", int(left * 1000))
        except Exception:  # noqa: BLE001 - a peer is gone or slow: exit anyway
            pass
        if self.pid == 0:
            time.sleep(1.0)  # let the others exit before the service they talk to goes away
        _stop(f"process {self.pid}: exiting after the error above", status)


def _client():
    """The coordination service client of ``jax.distributed`` (its key-value store)."""
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    if client is None:
        raise RuntimeError("jax.distributed is not initialized")
    return client


def sum_to_primary(values: list[int]) -> list[int]:
    """Sums integers over all processes onto process 0, through the coordination service's key-value
    store (host only, no device work); other processes get their own values back. Every process
    must call it the same number of times, in the same order."""
    import jax

    values = [int(v) for v in values]
    if jax.process_count() == 1:
        return values
    client, key = _client(), f"ringattention/sum/{next(_SUMS)}"
    if jax.process_index() != 0:
        client.key_value_set(f"{key}/{jax.process_index()}", json.dumps(values))
        return values
    for p in range(1, jax.process_count()):
        other = json.loads(client.blocking_key_value_get(f"{key}/{p}", KV_TIMEOUT_MS))
        values = [a + b for a, b in zip(values, other, strict=True)]
        client.key_value_delete(f"{key}/{p}")
    return values
