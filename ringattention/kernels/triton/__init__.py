"""Pallas Triton ring step for NVIDIA GPUs: ``implementation="pallas_gpu"``, registered here.

The fused inner loop of Ring Attention (Liu, Zaharia & Abbeel 2023) tiled like FlashAttention-2
(Dao 2023), for Ampere and newer. This module is the entry: it registers the step with
``ringattention.implementations`` and imports no kernel; the step module (and with it Pallas Triton,
deprecated since jax 0.11) is imported when "auto" asks whether it is available on an NVIDIA mesh or
a ring first runs it (``Implementation.load``).

Files:

* ``pallas_gpu.py``: the step (``forward_step``, ``backward_step``; contract in
  ``ringattention/implementations.py``): ``BlockSizes``, tuned defaults, the ``pallas_call``s.
* ``kernels.py``: the kernel bodies (forward, dq, dk/dv).

The float32 reference steps the kernels are tested against are ``ringattention/kernels/reference.py``.
"""

from __future__ import annotations

import importlib

from ringattention import implementations
from ringattention.implementations import Implementation, register


def _cuda_mesh(mesh=None) -> bool:
    """True where the mesh's devices are NVIDIA GPUs (Triton and Mosaic GPU kernels)."""
    return (
        implementations.platform(mesh) == "gpu"  # looked up at call time: tests patch them
        and "nvidia" in str(implementations.mesh_device(mesh).device_kind).lower()
    )


def _available(mesh=None) -> bool:
    """An NVIDIA mesh, and jax still has the Pallas Triton backend (deprecated since jax 0.11):
    where importing it fails, "auto" passes over pallas_gpu (docs/kernels.md)."""
    if not _cuda_mesh(mesh):
        return False
    try:
        importlib.import_module("ringattention.kernels.triton.pallas_gpu")
        return True
    except ImportError:
        return False


register(
    Implementation(
        "pallas_gpu",
        "ringattention.kernels.triton.pallas_gpu",
        platforms=("gpu",),
        available=_available,
        features=frozenset({"softcap", "prefix", "bidirectional", "v_head_dim"}),
    )
)
