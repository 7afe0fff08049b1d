"""Registry of inner-loop implementations of one ring step.

Every implementation provides the same two functions over one device's query shard and the key/value
shard it holds in the current ring step (shapes: B batch, Sq/Sk shard lengths, H query heads, K kv heads,
D head dim; positions are *global* and increasing within a shard):

``forward_step(q, k, v, q_pos, k_pos, q_seg, k_seg, *, causal, softmax_scale, block_sizes, interpret)``
    q [B, Sq, H, D], k/v [B, Sk, K, D] (same dtype), q_pos [Sq] int32, k_pos [Sk] int32,
    q_seg [B, Sq] int32 | None, k_seg [B, Sk] int32 | None.
    Returns ``o`` float32 [B, Sq, H, D], the attention output over this step's visible keys (0 for rows
    that see none), and ``lse`` float32 [B, H, Sq], its log-sum-exp of scaled logits (-inf for such rows).

``backward_step(q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, *, causal, softmax_scale,
block_sizes, interpret)``
    do [B, Sq, H, D] (q's dtype), lse float32 [B, H, Sq] (the *global* lse of the whole ring pass),
    delta float32 [B, H, Sq] = rowsum(o * do) of the final output. Returns float32 dq [B, Sq, H, D],
    dk [B, Sk, K, D], dv [B, Sk, K, D]: this step's contributions.

Query head ``h`` reads kv head ``h // (H // K)``; kv heads are never repeated in memory.

``deterministic_block_sizes(block_sizes, head_dim, causal, v_head_dim) -> block_sizes`` (optional)
    What ``ring_attention(..., deterministic=True)`` runs with: block sizes (None: the defaults for
    ``head_dim``, ``causal`` (the ring's mask) and ``v_head_dim`` (v's)) whose
    forward and backward steps add up their sums in a fixed order, so that two runs on the same
    inputs give the same bits. Raises ValueError if the given block sizes cannot. An implementation
    without it is deterministic as it is: "xla" (plain XLA ops; on GPU XLA's own scatters, reductions
    and autotuning need ``--xla_gpu_deterministic_ops=true`` in ``XLA_FLAGS``), "pallas_gpu" (a dq
    kernel per query block and a dk/dv kernel per key block, each summing over the other side in a
    sequential loop and writing once; no atomics), "pallas_tpu" (the reduction axes of its grids are
    "arbitrary", i.e. sequential). "pallas_hopper" defines it: its fused backward reduce-adds dq.

With a sliding window the ring passes ``window=W`` (a positive int) to both functions as one more
keyword: a key is then visible only if ``|q_pos - k_pos| < W`` as well. It is passed only when a
window is set, so an implementation without windows keeps working for everything else.

Optional features, each passed to both functions only when used, and only to implementations that
list it in ``Implementation.features`` ("auto" passes over the others; naming one that lacks a
feature the call uses is a ValueError):

``"softcap"``: keyword ``softcap=C`` (float > 0): the logits are ``C * tanh(softmax_scale * q.k / C)``
    (Gemma 2), masked after capping; the backward multiplies ``ds`` by ``1 - (s / C) ** 2``.
``"prefix"``: keyword ``prefix`` int32 [B]: a bidirectional prefix per batch row (``masks.visible``);
    passed only with ``causal=True``.
``"bidirectional"``: keyword ``bidirectional=True``: segments with negative ids are bidirectional
    (``masks.visible``); passed only with ``causal=True`` and segment ids.
``"v_head_dim"``: v has its own head dim Dv: v [B, Sk, K, Dv], o and do [B, Sq, H, Dv], dv
    [B, Sk, K, Dv] (MLA shapes: 192 for q/k, 128 for v).

``forward_step(..., out_dtype=q.dtype)``, for implementations with ``Implementation.out_dtype``:
``o`` in that dtype. Never a requirement: the ring passes it where its lap is one step without
sinks (a ring of one device, Ulysses), whose output is final, so the kernel writes it once in the
final dtype instead of float32 that XLA converts after (the same bits: both round to nearest even).

Attention sinks never reach a step: the ring merges them into the final lse once (``ring.py``).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import jax
from jax.sharding import Mesh


@dataclasses.dataclass(frozen=True)
class Implementation:
    name: str
    module: str  # imported lazily; must define forward_step and backward_step
    platforms: tuple[str, ...]  # platforms on which "auto" may pick it, best first in AUTO_ORDER
    available: Callable[..., bool] = lambda mesh=None: True  # (mesh) -> bool
    # (shard) -> bool: the kernel takes a ring shard of this many tokens; "auto" passes over it if not
    takes_shard: Callable[[int], bool] = lambda shard: True
    # optional features of the step contract (module docstring) that the kernel implements
    features: frozenset[str] = frozenset()
    out_dtype: bool = False  # forward_step takes out_dtype (module docstring)

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)


_REGISTRY: dict[str, Implementation] = {}

# "auto" tries these in order and takes the first registered, available one for the platform.
AUTO_ORDER = ("pallas_hopper", "pallas_gpu", "pallas_tpu", "xla")


def register(impl: Implementation) -> None:
    _REGISTRY[impl.name] = impl


def names() -> tuple[str, ...]:
    return ("auto", *_REGISTRY)


def mesh_device(mesh: Mesh | None = None) -> Any:
    """The device (platform, device_kind) that the code being traced runs on: the devices of the
    enclosing ``shard_map``'s mesh (or ``jax.sharding.use_mesh``), else ``jax.devices()[0]``. So a
    ring traced on a CPU host for a TPU or GPU mesh (ahead-of-time compilation) picks that mesh's
    kernels. ``mesh``: a ``jax.sharding.Mesh`` to ask instead. Returns an object with ``.platform``
    ("cpu", "gpu", "tpu") and ``.device_kind``."""
    if mesh is not None and getattr(mesh, "devices", None) is not None and mesh.devices.size:
        return mesh.devices.flat[0]
    device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    if device is not None and getattr(device, "platform", None):
        return device
    return jax.devices()[0]


def platform(mesh: Mesh | None = None) -> str:
    """The platform of :func:`mesh_device`: "cpu", "gpu" or "tpu"."""
    name = mesh_device(mesh).platform
    return "gpu" if name in ("cuda", "rocm") else name


FEATURES = ("softcap", "prefix", "bidirectional", "v_head_dim")


def resolve(
    name: str, mesh: Mesh | None = None, shard: int | None = None, needs: frozenset[str] = frozenset()
) -> Implementation:
    """Returns the implementation called ``name`` ("auto": the best for the platform of ``mesh``,
    or of the mesh being traced; see :func:`mesh_device`). ``shard``:
    the ring's shard length, so "auto" takes only kernels that take it (pallas_tpu: multiples of
    128 tokens; a decoder's short prefill falls back to "xla"). ``needs``: the optional features
    (module docstring) the call uses; "auto" takes only kernels that have them all, a named one
    that lacks one is a ValueError."""
    needs = frozenset(needs)
    if name == "auto":
        where = platform(mesh)
        for candidate in AUTO_ORDER:
            impl = _REGISTRY.get(candidate)
            if impl is None:
                continue
            if shard is not None and not impl.takes_shard(shard):
                continue
            if not needs <= impl.features:
                continue
            if where in impl.platforms and impl.available(mesh):
                return impl
        return _REGISTRY["xla"]
    if name not in _REGISTRY:
        raise ValueError(f"implementation={name!r} is not known; choose one of {names()}")
    impl = _REGISTRY[name]
    if not needs <= impl.features:
        have = [n for n, i in _REGISTRY.items() if needs <= i.features]
        raise ValueError(
            f"implementation={name!r} does not support {sorted(needs - impl.features)}"
            f"; these do: {have} (or 'auto')"
        )
    return impl


def deterministic_block_sizes(
    impl: Implementation, block_sizes: Any, head_dim: int, causal: bool = True, v_head_dim: int | None = None
) -> Any:
    """``block_sizes`` for ``deterministic=True``: the module's hook (contract above) if it has one."""
    hook = getattr(impl.load(), "deterministic_block_sizes", None)
    return block_sizes if hook is None else hook(block_sizes, head_dim, causal, v_head_dim)


# The pure-JAX step; the Pallas kernels register themselves, one package per backend
# (``ringattention.kernels``: hopper, triton, tpu), which ``import ringattention`` imports.
register(
    Implementation(
        "xla", "ringattention.blockwise", platforms=("cpu", "gpu", "tpu"), features=frozenset(FEATURES)
    )
)
