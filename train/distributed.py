"""Multi-host start-up: ``jax.distributed.initialize`` from explicit flags or a SLURM / TPU launch.

Every process runs the same command and config; process 0 writes metrics and prints.
"""

from __future__ import annotations

import itertools
import json
import os

from train.config import DistributedSection

KV_TIMEOUT_MS = 300_000  # how long process 0 waits for the others' values (they run in lockstep)
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
        raise ValueError(f"distributed.num_processes={cfg.num_processes} needs "
                         "distributed.coordinator_address and distributed.process_id")
    jax.distributed.initialize(**kwargs)
    return True


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
