"""Training for ring-attention LLaMA models: ``python -m train --config configs/debug.yaml``.

Importing this package does not import jax, so ``python -m train`` can set XLA flags (virtual CPU
devices) from the config before jax starts. Ring Attention (Liu, Zaharia & Abbeel 2023).
"""

import importlib.util as _util
import pathlib as _pathlib


def shadowing_models() -> str | None:
    """The file of an importable ``models`` that is not this project's models package (a user's own
    ``models.py`` in the working directory, which ``python -m`` puts first on ``sys.path``), or
    None. The ``ringattention-train`` command does not put the working directory on the path."""
    ours = _pathlib.Path(__file__).resolve().parent.parent / "models"
    try:
        spec = _util.find_spec("models")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    origin = _pathlib.Path(spec.origin).resolve()
    return None if origin.parent == ours else str(origin)
