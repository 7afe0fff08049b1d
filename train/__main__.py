"""``python -m train --config configs/X.yaml [--a.b=c ...]``; ``--help`` lists every option.

The config is read before jax is imported: ``cpu_devices: N`` sets
``--xla_force_host_platform_device_count=N`` (and the CPU platform) so N virtual devices exist.
"""

from __future__ import annotations

import os
import sys

from train import config as config_lib

USAGE = """usage: python -m train --config CONFIG.yaml [--section.key=value ...]

Trains a LLaMA with ring attention. Options (YAML keys; override any with --dotted.key=value,
values are parsed as YAML, e.g. --data.paths='[a.jsonl, b.txt]'):
"""


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


def use_cpu_devices(count: int) -> None:
    """Forces ``count`` virtual CPU devices; must run before jax is imported."""
    if "jax" in sys.modules:
        raise RuntimeError("cpu_devices must be set before jax is imported")
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={count}"])
    os.environ["JAX_PLATFORMS"] = "cpu"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(USAGE + config_lib.help_text())
        return 0
    path, overrides = split_args(argv)
    try:
        config = config_lib.load(path, overrides)
        config_lib.check(config)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if config.cpu_devices:
        use_cpu_devices(config.cpu_devices)
    import jax

    from train import train

    train.main(config)
    if jax.process_count() > 1:
        jax.distributed.shutdown()  # a barrier: no process exits while others still talk to it
    return 0


if __name__ == "__main__":
    sys.exit(main())
