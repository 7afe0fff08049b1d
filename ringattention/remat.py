"""Rematerialisation policies that keep ring attention's output and log-sum-exp.

Under ``jax.checkpoint`` with a policy that saves nothing, the backward pass recomputes a whole
transformer block, ring attention's forward lap included: about a third more attention work than the
forward + backward laps alone (Ring Attention with Blockwise Transformers, Liu, Zaharia & Abbeel 2023).
The ring's custom VJP needs only q, k, v (cheap to recompute from the block input), the output ``o``
and the float32 log-sum-exp ``lse`` (FlashAttention-2, Dao 2023), so saving those two names per layer
is enough for the backward pass never to run the forward lap again. ``ring.py`` tags them with
``checkpoint_name``; the policies below save them on the device or offload them to host memory.

    block = jax.checkpoint(block, policy=ringattention.remat.save_attention())
    block = jax.checkpoint(block, policy=ringattention.remat.offload_attention())  # pinned host
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax

HOST_LIMIT_ENV = "XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB"  # the GPU client's pinned-host pool; 64 GB if unset
OUT_NAME = "ring_attention_out"  # [batch, shard, heads, head_dim], q's dtype
LSE_NAME = "ring_attention_lse"  # [batch, heads, shard], float32
NAMES = (OUT_NAME, LSE_NAME)


def save_attention() -> Callable[..., bool]:
    """A ``jax.checkpoint`` policy saving ring attention's output and lse; all else is recomputed."""
    return jax.checkpoint_policies.save_only_these_names(*NAMES)


def offload_attention(src: str = "device", dst: str = "pinned_host") -> Callable[..., Any]:
    """Like :func:`save_attention`, but the saved arrays move to ``dst`` memory (host RAM) between
    the forward and backward passes, so device memory holds only the blocks' inputs.

    Offloading needs a backend with host memory spaces (GPU, TPU); on CPU the arrays simply stay.
    """
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[],
        names_which_can_be_offloaded=list(NAMES),
        offload_src=src,
        offload_dst=dst,
    )


def allow_host_offload(fraction: float = 0.8) -> int | None:
    """Lets the GPU client pin up to ``fraction`` of this machine's RAM for offloaded arrays.

    jax's GPU client allocates pinned host memory from a pool of 64 GB unless
    ``XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB`` says otherwise; the 1B model at 1,048,576 tokens offloads
    66 GiB (measured on an H200, ``benchmarks/results/model_1b_h200.md``). Sets the variable
    (whole GB) unless it is set already, and returns its value; the GPU client reads it when it is
    created, so call this before the first computation. None where the RAM size is unknown.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"{fraction=} must be in (0, 1]")
    if os.environ.get(HOST_LIMIT_ENV):
        return int(float(os.environ[HOST_LIMIT_ENV]))
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    gb = max(1, int(ram * fraction / 1e9))
    os.environ[HOST_LIMIT_ENV] = str(gb)
    return gb
