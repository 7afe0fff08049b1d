"""Argument checks shared by ``ring_attention``, ``sharded_attention`` and ``reference_attention``.

Each raises a ``TypeError`` / ``ValueError`` naming the argument and its value before anything is
traced, and returns the value in the form the callers use (a Python bool, float or int).
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np

INT32_MAX = 2**31 - 1  # positions are int32: no two differ by more


def causal(value: Any) -> bool:
    """``causal`` as a Python bool; a TypeError for anything but a (numpy) bool."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"causal={value!r} must be a bool (True or False); got {type(value).__name__}")


def softmax_scale(value: Any) -> float | None:
    """``softmax_scale`` as a float (None stays None): a positive finite number, numpy scalars
    included."""
    if value is None:
        return None
    number = isinstance(value, (int, float, np.integer, np.floating))
    if not number or isinstance(value, (bool, np.bool_)) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"softmax_scale={value!r} must be a positive number or None")
    return float(value)


def segment_ids(
    value: Any, shape: tuple[int, ...], name: str = "segment_ids", dims: str = "[batch, seq]"
) -> None:
    """Raises unless ``value`` is None or an integer array of exactly ``shape``."""
    if value is None:
        return
    got = getattr(value, "shape", None)
    if got is None or tuple(got) != tuple(shape):
        raise ValueError(f"{name} must be {dims} = {tuple(shape)}; got {name}.shape={got}")
    if not jnp.issubdtype(value.dtype, jnp.integer):
        raise TypeError(f"{name} must be integers; got {name}.dtype={value.dtype}")


def sliding_window(value: Any) -> int | None:
    """``sliding_window`` as an int, or None where it hides nothing: a window wider than any
    difference of int32 positions (> 2**31 - 1) is no window. A positive (numpy) int or None."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"sliding_window={value!r} must be a positive int or None")
    return None if value > INT32_MAX else int(value)
