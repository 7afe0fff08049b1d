"""Pallas Mosaic GPU ring step for Hopper (H100, H200): ``implementation="pallas_hopper"``.

A FlashAttention-3 style forward and backward (Shah et al. 2024) for the inner loop of Ring
Attention (Liu, Zaharia & Abbeel 2023). This module is the entry: it registers the step with
``ringattention.implementations`` and imports no kernel; the step module (and with it Mosaic GPU) is
imported when "auto" asks whether it is available on a GPU mesh or a ring first runs it
(``Implementation.load``).

Files:

* ``pallas_hopper.py``: the step (``forward_step``, ``backward_step``,
  ``deterministic_block_sizes``; contract in ``ringattention/implementations.py``): ``BlockSizes``,
  tuned defaults, padding, the forward's launch and which backward runs.
* ``fwd_kernel.py``: the forward kernel body (producer and compute warpgroups, masks).
* ``fwd_loops.py``: the compute warpgroups' key-block loops (ping-pong, FA3's overlap).
* ``backward.py``: the two-kernel backward ("mosaic"): padding, bounds, launches.
* ``bwd_kernels.py``: its dq and dk/dv kernel bodies.
* ``fused_bwd.py``: the fused backward's launch, sizes and GQA split.
* ``cta_dq_bwd.py``: the fused backward ("fused"): one kernel over key CTAs, dq by TMA reduce-adds.
* ``split_bwd.py``: the head-dim-split dq and dk/dv kernels above head dim 128.
"""

from __future__ import annotations

import importlib

from ringattention.implementations import Implementation, register


def _available(mesh=None) -> bool:
    try:  # importing Mosaic GPU (or pallas_gpu's Triton helpers it uses) can fail on some jax
        step = importlib.import_module("ringattention.kernels.hopper.pallas_hopper")
    except ImportError:
        return False
    return step.available(mesh)


register(Implementation("pallas_hopper", "ringattention.kernels.hopper.pallas_hopper",
                        platforms=("gpu",), available=_available,
                        features=frozenset({"softcap", "prefix", "bidirectional", "v_head_dim"})))
