"""Pallas Mosaic GPU ring step for Hopper (H100, H200): ``implementation="pallas_hopper"``.

A FlashAttention-3 style forward and backward (Shah et al. 2024) for the inner loop of Ring
Attention (Liu, Zaharia & Abbeel 2023). This module is the entry: it registers the step with
``ringattention.implementations`` and imports no kernel; the step module (and with it Mosaic GPU) is
imported when "auto" asks whether it is available on a GPU mesh or a ring first runs it
(``Implementation.load``).

Files:

* ``pallas_hopper.py``: the step (``forward_step``, ``backward_step``,
  ``deterministic_block_sizes``; contract in ``ringattention/implementations.py``): padding, the
  forward's launch and which backward runs; it re-exports ``block_sizes.py``'s public names
  (``pallas_hopper.BlockSizes``). Float32 inputs and ``BlockSizes(backward="triton")`` run the
  Triton step (``triton/pallas_gpu.py``), imported only then (float32 falls back to the XLA step
  where this jax has no Pallas Triton).
* ``block_sizes.py``: ``BlockSizes``, the tuned defaults per head dim (each beside its reason),
  ``default_block_sizes`` and ``deterministic_block_sizes``.
* ``mosaic.py``: what every kernel here shares: the launch of two compute warpgroups and a
  producer, the register split, wgmma ``Ops`` (plain ``jnp`` in interpret mode), ``FwdConfig``.
* ``fwd_kernel.py``: the forward kernel body (producer and compute warpgroups, masks).
* ``fwd_loops.py``: the compute warpgroups' key-block loops (ping-pong, FA3's overlap).
* ``warp_rescale.py``: the forward's accumulator rescale, skipped per warp where nothing changed.
* ``backward.py``: the two-kernel backward ("mosaic"): padding, bounds, launches.
* ``bwd_kernels.py``: its dq and dk/dv kernel bodies.
* ``bwd_common.py``: what every backward kernel shares (``BwdConfig``, masks, block loops).
* ``fused_bwd.py``: the frame of the fused backward (its key-CTA launch, dq buffer, GQA split).
* ``cta_dq_bwd.py``: the fused backward ("fused"): one kernel over key CTAs, dq by TMA reduce-adds.
* ``split_bwd.py``: the head-dim-split backward above head dim 128 (padding, launches);
  ``split_kernels.py``: its dq and dk/dv kernel bodies.

Padding, sentinels, block bounds and input checks come from ``kernels/common.py`` (no Pallas
backend), the float32 reference steps from ``kernels/reference.py``: nothing here imports Pallas
Triton for 16-bit inputs, so "auto" keeps this step on a jax without it.
"""

from __future__ import annotations

import importlib

from ringattention.implementations import Implementation, register


def _available(mesh=None) -> bool:
    try:  # importing Mosaic GPU can fail on some jax (Pallas Triton is not needed)
        step = importlib.import_module("ringattention.kernels.hopper.pallas_hopper")
    except ImportError:
        return False
    return step.available(mesh)


register(
    Implementation(
        "pallas_hopper",
        "ringattention.kernels.hopper.pallas_hopper",
        platforms=("gpu",),
        available=_available,
        features=frozenset({"softcap", "prefix", "bidirectional", "v_head_dim"}),
        out_dtype=True,
    )
)
