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


def struct(shape, dtype, *like) -> jax.ShapeDtypeStruct:
    """A kernel's ``out_shape``: ``ShapeDtypeStruct(shape, dtype)`` varying over every manual axis
    that any array of ``like`` varies over. ``shard_map(check_vma=True)`` needs it on every
    ``pallas_call`` output; under ``check_vma=False`` and outside ``shard_map`` it is ignored."""
    arrays = [x for x in like if x is not None]
    if not arrays:
        raise TypeError("struct() needs at least one array in like= to take its varying axes from")
    vma = frozenset().union(*(_vma(x) for x in arrays))
    mat = jax.typeof(arrays[0]).manual_axis_type.update(varying=vma)
    return jax.ShapeDtypeStruct(tuple(shape), dtype, manual_axis_type=mat)


def typed_by_args(make_kernel, out_type):
    """``make_kernel(out_type)(*args)`` with every output varying like ``args`` (a kernel launcher
    whose output types are fixed before its arguments are known)."""

    def call(*args):
        arrays = [a for a in jax.tree.leaves(args) if isinstance(a, jax.Array)]
        if not arrays:
            return make_kernel(out_type)(*args)
        typed = jax.tree.map(lambda s: struct(s.shape, s.dtype, *arrays), out_type)
        return make_kernel(typed)(*args)

    return call
