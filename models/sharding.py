"""Device mesh ("dp", "fsdp", "tp", "sp", "usp") and logical-axis sharding rules for the LLaMA model.

Weights are sharded over fsdp, sp and usp (the sequence axes would otherwise hold idle weight copies,
as in Ring Attention, Liu et al. 2023), heads / MLP / vocab over tp; activations: batch over dp and
fsdp, sequence over ("sp", "usp"), heads over tp. Every parameter and activation carries logical axis
names that ``RULES`` maps to mesh axes; a mesh axis is dropped from a dimension that it does not
divide.

"usp" is the Ulysses axis of 2-D context parallelism (``ringattention.ulysses``; DeepSpeed-Ulysses,
Jacobs et al. 2023; USP, Fang & Zhao 2024): the sequence, in the ring layout's order for a ring of
"sp" devices, is split over ("sp", "usp") with the ring axis major, and attention exchanges heads for
sequence over "usp" around the ring. It is the mesh's last (fastest-varying) axis, so that a Ulysses
group is a run of neighbouring devices, i.e. within a host: the all-to-all wants the fast links, the
ring crosses hosts. A mesh without "usp" (size 1) still works.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = ("dp", "fsdp", "tp", "sp", "usp")
BATCH = ("dp", "fsdp")
SEQ = ("sp", "usp")  # the sequence: ring axis major, Ulysses axis minor
OPTIONAL = ("usp",)  # axes a mesh may lack (size 1)

# logical name -> mesh axes (None: replicated)
RULES: dict[str, tuple[str, ...] | None] = {
    # parameters
    "vocab": ("tp",),
    "embed": ("fsdp", "sp", "usp"),
    "heads": ("tp",),
    "kv_heads": ("tp",),
    "head_dim": None,
    "mlp": ("tp",),
    "norm": None,
    "layers": None,
    "experts": None,  # gpt-oss MoE experts (replicated; computed densely)
    # activations
    "act_batch": BATCH,
    "act_seq": SEQ,
    "act_embed": None,
    "act_heads": ("tp",),
    "act_kv_heads": ("tp",),
    "act_mlp": ("tp",),
    "act_vocab": ("tp",),
}


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the mesh axes; one of them may be -1 (= the remaining devices)."""

    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    sp: int = 1
    usp: int = 1

    def resolve(self, num_devices: int) -> dict[str, int]:
        sizes = {a: getattr(self, a) for a in AXES}
        for a, s in sizes.items():
            if not isinstance(s, int) or (s < 1 and s != -1):
                raise ValueError(f"mesh axis {a}={s!r} must be a positive int or -1")
        free = [a for a, s in sizes.items() if s == -1]
        if len(free) > 1:
            raise ValueError(f"at most one mesh axis may be -1; got {free} in {self}")
        fixed = math.prod(s for s in sizes.values() if s != -1)
        if free:
            if num_devices % fixed:
                raise ValueError(
                    f"{self} leaves {num_devices=} / {fixed} devices for {free[0]}, which is not an integer"
                )
            sizes[free[0]] = num_devices // fixed
        elif fixed != num_devices:
            raise ValueError(f"{self} has {'*'.join(AXES)}={fixed} but {num_devices=}")
        return sizes


def make_mesh(mesh_config: MeshConfig, devices: Sequence | None = None) -> Mesh:
    """A ``Mesh`` with axes ``AXES``; raises ValueError if the sizes don't fit."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = mesh_config.resolve(len(devices))
    grid = np.array(devices, dtype=object).reshape([sizes[a] for a in AXES])
    return Mesh(grid, AXES)


def axis_size(mesh: Mesh | None, name: str) -> int:
    return 1 if mesh is None else int(mesh.shape.get(name, 1))


def seq_shards(mesh: Mesh | None) -> int:
    """How many pieces the sequence is split into: sp * usp."""
    return axis_size(mesh, "sp") * axis_size(mesh, "usp")


def attention_axes(mesh: Mesh | None) -> tuple[str | tuple[str, ...], str | None]:
    """(sequence entry of a PartitionSpec, ``ulysses_axis`` for ring_attention) for ``mesh``."""
    if axis_size(mesh, "usp") > 1:
        return SEQ, "usp"
    return "sp", None


def logical_spec(
    names: Sequence[str | None], shape: Sequence[int] | None = None, mesh: Mesh | None = None
) -> P:
    """PartitionSpec for logical axis ``names``; axes that don't divide ``shape`` are dropped."""
    used: set[str] = set()
    out = []
    for i, name in enumerate(names):
        axes = RULES.get(name) if name is not None else None
        if name is not None and name not in RULES:
            raise ValueError(f"logical axis {name!r} has no sharding rule; known: {tuple(RULES)}")
        kept = []
        for a in axes or ():
            if a in used or (mesh is not None and a not in mesh.shape):
                continue
            size = math.prod(axis_size(mesh, b) for b in (*kept, a))
            if shape is not None and mesh is not None and shape[i] % size:
                continue
            kept.append(a)
        used.update(kept)
        out.append(tuple(kept) if len(kept) > 1 else (kept[0] if kept else None))
    return P(*out)


def constrain(x: jax.Array, names: Sequence[str | None], mesh: Mesh | None) -> jax.Array:
    """``with_sharding_constraint`` by logical names (a no-op without a mesh)."""
    if mesh is None:
        return x
    spec = logical_spec(names, x.shape, mesh)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def check_mesh(mesh: Mesh | None) -> None:
    if mesh is None:
        return
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh or None; got {type(mesh).__name__}")
    missing = [a for a in AXES if a not in mesh.shape and a not in OPTIONAL]
    if missing:
        raise ValueError(
            f"mesh is missing axes {missing}; mesh.shape={dict(mesh.shape)}; build it "
            "with models.sharding.make_mesh"
        )
