"""Varying-manual-axes helpers: new arrays made inside ``shard_map`` must vary like the inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def _vma(x) -> frozenset:
    aval = jax.typeof(x)
    vma = getattr(aval, "vma", None)  # older jax
    if vma is None:
        mat = getattr(aval, "manual_axis_type", None)  # jax >= 0.10
        vma = getattr(mat, "varying", frozenset())
    return frozenset(vma)


def vary_like(x, ref):
    """Marks ``x`` as varying over every manual axis that ``ref`` varies over."""
    missing = tuple(sorted(_vma(ref) - _vma(x), key=str))
    return lax.pcast(x, missing, to="varying") if missing else x


def full_like(ref, shape, fill, dtype=jnp.float32):
    """``jnp.full(shape, fill, dtype)`` varying like ``ref``."""
    return vary_like(jnp.full(shape, fill, dtype), ref)
