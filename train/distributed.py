"""Multi-host start-up: ``jax.distributed.initialize`` from explicit flags or a SLURM / TPU launch.

Every process runs the same command and config; process 0 writes metrics and prints.
"""

from __future__ import annotations

import os

from train.config import DistributedSection


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
