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

import jax

OUT_NAME = "ring_attention_out"  # [batch, shard, heads, head_dim], q's dtype
LSE_NAME = "ring_attention_lse"  # [batch, heads, shard], float32
NAMES = (OUT_NAME, LSE_NAME)


def save_attention():
    """A ``jax.checkpoint`` policy saving ring attention's output and lse; all else is recomputed."""
    return jax.checkpoint_policies.save_only_these_names(*NAMES)


def offload_attention(src: str = "device", dst: str = "pinned_host"):
    """Like :func:`save_attention`, but the saved arrays move to ``dst`` memory (host RAM) between
    the forward and backward passes, so device memory holds only the blocks' inputs.

    Offloading needs a backend with host memory spaces (GPU, TPU); on CPU the arrays simply stay.
    """
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=list(NAMES), offload_src=src,
        offload_dst=dst)
