"""Argument checks shared by ``ring_attention``, ``sharded_attention`` and ``reference_attention``.

Each raises a ``TypeError`` / ``ValueError`` naming the argument and its value before anything is
traced, and returns the value in the form the callers use (a Python bool, float or int).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

INT32_MAX = 2**31 - 1  # positions are int32: no two differ by more


def causal(value: Any) -> bool:
    """``causal`` as a Python bool; a TypeError for anything but a (numpy) bool."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"causal={value!r} must be a bool (True or False); got {type(value).__name__}")


def _positive_number(name: str, value: Any) -> float | None:
    """``value`` as a float (None stays None): a positive finite number, numpy scalars included;
    ValueError naming ``name`` otherwise."""
    if value is None:
        return None
    if (
        isinstance(value, (jax.Array, np.ndarray))
        and value.shape == ()
        and jnp.issubdtype(value.dtype, jnp.number)
    ):
        try:
            value = value.item()  # a 0-d array: jnp.float32(3.0), np.asarray(0.25)
        except jax.errors.ConcretizationTypeError:
            raise TypeError(
                f"{name} must be a concrete number (it fixes the kernels traced); got a traced value {value}"
            ) from None
    number = isinstance(value, (int, float, np.integer, np.floating))
    if not number or isinstance(value, (bool, np.bool_)) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r} must be a positive number or None")
    return float(value)


def softmax_scale(value: Any) -> float | None:
    """``softmax_scale`` as a float (None stays None): a positive finite number."""
    return _positive_number("softmax_scale", value)


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


def sinks(value: Any, heads: int) -> None:
    """Raises unless ``value`` is None or a floating array [heads] (one logit per query head)."""
    if value is None:
        return
    got = getattr(value, "shape", None)
    if got is None or tuple(got) != (heads,):
        raise ValueError(
            f"sinks must be [heads] = ({heads},), one logit per query head; got sinks.shape={got}"
        )
    if not jnp.issubdtype(value.dtype, jnp.floating):
        raise TypeError(f"sinks must be floating point; got sinks.dtype={value.dtype}")


def logits_soft_cap(value: Any) -> float | None:
    """``logits_soft_cap`` as a float (None stays None): a positive finite number."""
    return _positive_number("logits_soft_cap", value)


def prefix_length(value: Any, batch: int, is_causal: bool) -> jax.Array | None:
    """``prefix_length`` as int32 [batch] (a Python int: the same for every row), or None. It
    relaxes the causal mask, so it needs ``causal=True``."""
    if value is None:
        return None
    if not is_causal:
        raise ValueError(
            f"prefix_length needs causal=True (a bidirectional prefix, causal after "
            f"it); got causal=False and prefix_length={value!r}"
        )
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"prefix_length={value!r} must be an int or an int array [batch]")
    if isinstance(value, (int, np.integer)):
        if value < 0:
            raise ValueError(f"prefix_length={value!r} must be >= 0")
        return jnp.full((batch,), value, jnp.int32)
    got = getattr(value, "shape", None)
    if got is None or tuple(got) != (batch,):
        raise ValueError(
            f"prefix_length must be an int or [batch] = ({batch},); got prefix_length.shape={got}"
        )
    if not jnp.issubdtype(value.dtype, jnp.integer):
        raise TypeError(f"prefix_length must be integers; got prefix_length.dtype={value.dtype}")
    try:
        rows = np.asarray(value)
    except jax.errors.TracerArrayConversionError:  # traced: checked where it is made
        rows = None
    if rows is not None and (rows < 0).any():
        raise ValueError(f"prefix_length must be >= 0 in every row; got prefix_length={rows.tolist()}")
    return jnp.asarray(value).astype(jnp.int32)


def bidirectional_segments(value: Any, is_causal: bool, segment_ids: Any) -> bool:
    """``bidirectional_segments`` as a bool: True needs ``causal=True`` and segment ids. Under a
    non-causal mask every segment is bidirectional already, so it only applies with causal."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"bidirectional_segments={value!r} must be a bool")
    if value and segment_ids is None:
        raise ValueError(
            "bidirectional_segments=True needs segment_ids (negative ids mark the bidirectional segments)"
        )
    if value and not is_causal:
        raise ValueError(
            "bidirectional_segments=True needs causal=True (without it every segment is bidirectional)"
        )
    return bool(value)
