"""``python -m train --config configs/X.yaml [--a.b=c ...]``; ``--help`` lists every option.

The config is read before jax is imported: ``cpu_devices: N`` sets
``--xla_force_host_platform_device_count=N`` (and the CPU platform) so N virtual devices exist, and
``deterministic: true`` sets ``--xla_gpu_deterministic_ops=true``. Mistakes in the config, and
settings found not to work while setting up (data paths, a sequence the ring cannot split, a
damaged checkpoint), end with one ``config error: ...`` / ``checkpoint error: ...`` line and exit
status 2 (so does a bare ``python -m train``, printing the usage). A step whose loss or gradient
norm is not finite ends the run with one ``training stopped: ...`` line naming the last good step
and its checkpoint, exit status 1 (``--skip_nonfinite=N`` skips such steps instead;
``train.guard``). In a multi-process job a failing process tells the others, which exit at once
naming it (``train.distributed.Watchdog``).

Relaunching with the same ``run_dir`` resumes its newest complete checkpoint (``train.resume``):
options that change the data stream or the model (data, model, mesh, optim.accum_steps,
deterministic) must match ``run_dir/config.yaml`` unless ``--resume.allow_changes=true``; every
accepted change is recorded there; ``--steps`` must exceed the resumed step (a missing final
evaluation runs alone); ``metrics.jsonl`` keeps each step once.
"""

from __future__ import annotations

import os
import sys

from train import config as config_lib

USAGE = """usage: python -m train --config CONFIG.yaml [--section.key=value ...]

Trains a LLaMA with ring attention. Options (YAML keys; override any with --dotted.key=value,
values are parsed as YAML, e.g. --data.paths='[a.jsonl, b.txt]'):
"""
EXIT_SETUP = 2  # a config, data or checkpoint mistake
EXIT_ERROR = 1  # any other failure


def split_args(argv: list[str]) -> tuple[str | None, list[str]]:
    """``(config path, remaining overrides)`` from the command line."""
    path, rest, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 >= len(argv):
                raise ValueError("--config needs a path")
            path, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return path, rest


def _split_or_none(argv: list[str]) -> tuple[str | None, list[str]]:
    try:
        return split_args(argv)
    except ValueError:
        return None, []


def _set_xla_flag(prefix: str, flag: str) -> None:
    if "jax" in sys.modules:
        raise RuntimeError(f"{flag} must be set before jax is imported")
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(prefix)]
    os.environ["XLA_FLAGS"] = " ".join([*flags, flag])


def use_cpu_devices(count: int) -> None:
    """Forces ``count`` virtual CPU devices; must run before jax is imported."""
    _set_xla_flag("--xla_force_host_platform_device_count", f"--xla_force_host_platform_device_count={count}")
    os.environ["JAX_PLATFORMS"] = "cpu"


def use_deterministic_ops() -> None:
    """Makes XLA's own GPU ops deterministic (a no-op elsewhere); must run before jax is imported."""
    _set_xla_flag("--xla_gpu_deterministic_ops", config_lib.XLA_DETERMINISTIC)


def _fail_before_start(path: str | None, overrides: list[str], message: str) -> int:
    """A config that does not load: print it; in a multi-process job, still join the others (from
    the ``distributed`` options alone) so that they exit too instead of waiting for this one."""
    print(message, file=sys.stderr, flush=True)
    try:
        dist, cpu_devices = config_lib.load_launch(path, overrides)
    except Exception:  # noqa: BLE001 - the file itself is bad: the environment alone may say more
        dist, cpu_devices = config_lib.DistributedSection(), 0
    try:
        from train import distributed

        if not distributed.wants_initialize(dist):
            return EXIT_SETUP
        if cpu_devices:
            use_cpu_devices(cpu_devices)
        watchdog = distributed.start(dist)
    except Exception as e:  # noqa: BLE001 - cannot reach the others: this process's error stands
        print(f"(could not tell the other processes: {type(e).__name__}: {e})", file=sys.stderr)
        return EXIT_SETUP
    if watchdog is not None:
        watchdog.fail(message, EXIT_SETUP)  # does not return
    return EXIT_SETUP


def _stop(message: str, code: int, watchdog) -> int:
    """Ends the run with ``message`` as its one stderr line and exit status ``code``; in a
    multi-process job the watchdog tells the others and exits (it does not return)."""
    print(message, file=sys.stderr, flush=True)
    if watchdog is not None:
        watchdog.fail(message, code)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(USAGE + config_lib.help_text())
        return 0
    if not argv:  # a bare `python -m train` would start a long run with every default
        print(
            USAGE.splitlines()[0] + "\n(--help lists every option; configs/debug.yaml is the small CPU demo)",
            file=sys.stderr,
        )
        return EXIT_SETUP
    try:
        path, overrides = split_args(argv)
        config = config_lib.load(path, overrides)
        config_lib.check(config)
    except (ValueError, TypeError, OSError) as e:
        path, overrides = _split_or_none(argv)
        return _fail_before_start(path, overrides, f"config error: {' '.join(str(e).split())}")
    if config.cpu_devices:
        use_cpu_devices(config.cpu_devices)
    if config.deterministic:
        use_deterministic_ops()
    if any(s.model.overrides.get("remat") == "offload_attn" for s in config_lib.stage_configs(config)):
        from ringattention import remat  # before the GPU client exists: its pinned-host pool

        remat.allow_host_offload()
    import jax

    from train import distributed, train
    from train.checkpoint import CheckpointError
    from train.guard import NonFiniteError

    watchdog = None
    try:
        watchdog = distributed.start(config.distributed)
        train.main(config)
    except (config_lib.ConfigError, CheckpointError) as e:
        kind = "config" if isinstance(e, config_lib.ConfigError) else "checkpoint"
        return _stop(f"{kind} error: {' '.join(str(e).split())}", EXIT_SETUP, watchdog)
    except NonFiniteError as e:
        return _stop(f"training stopped: {' '.join(str(e).split())}", EXIT_ERROR, watchdog)
    except BaseException as e:
        if watchdog is None:
            raise
        import traceback

        traceback.print_exc()
        watchdog.fail(f"{type(e).__name__}: {' '.join(str(e).split())[:1000]}", EXIT_ERROR)
    if watchdog is not None:
        watchdog.stop()
    if jax.process_count() > 1:
        jax.distributed.shutdown()  # a barrier: no process exits while others still talk to it
    return 0


if __name__ == "__main__":
    sys.exit(main())
