"""Ulysses x ring: 2-D context parallelism, an all-to-all over heads around the ring.

DeepSpeed-Ulysses (Jacobs et al. 2023) splits the sequence over a group of U devices and, before
attention, trades sequence for heads with one all-to-all: each device then holds the whole sequence
for H / U of the heads, attends locally, and a second all-to-all gives the sequence split back. USP
(Fang & Zhao 2024) runs a ring (Ring Attention, Liu et al. 2023) inside every Ulysses group: the
all-to-all is cheap on a fast intra-node link, the ring scales across nodes.

Sequence layout (what keeps the ring exact). The global sequence is put in the ring's layout order
for a ring of N = ``|seq_axis|`` devices, exactly as without Ulysses, and split over the mesh axes
``(seq_axis, ulysses_axis)`` with the ring axis major (``P(..., (seq_axis, ulysses_axis), ...)``):
ring shard s, whose global positions are ``layouts.shard_positions(layout, L / N, N, s)``, is cut into
U consecutive pieces and piece u lives on device (s, u). The all-to-all over ``ulysses_axis``
concatenates the pieces in rank order, so every device of Ulysses group s holds ring shard s in
layout order (group rank u gets heads ``[u H/U, (u+1) H/U)``), the ring runs over ``seq_axis`` with its
usual global positions, causal skipping and layouts, and the inverse all-to-all returns the output to
[this device's piece, all heads]. The global layout order, and so the RoPE positions, depend on N
only.

GQA/MQA: kv heads that U does not divide are repeated ``U / gcd(K, U)`` times before the exchange
(query head h still reads original kv head ``h // (H / K)``), the fewest copies that give every rank
whole kv heads; the query heads must divide by U. Segment ids are all-gathered over
``ulysses_axis`` (they are the same for every head). The exchange is linear: JAX differentiates
through it (its transpose is the inverse all-to-all, the repeat's transpose sums the copies), while
the ring keeps its own ``custom_vjp``.

Bytes sent per device per layer, forward, at shard length S = L / (N U) and head dim D (elements,
times the dtype size): the exchange sends (U - 1) / U of q, k, v and o, i.e.
``(U - 1) / U * S * D * (2 H + 2 K')`` with K' = K repeated; the ring sends its k, v shard (now
``U S`` long with ``K' / U`` heads) N - 1 times: ``(N - 1) * U S * 2 (K' / U) D = (N - 1) S 2 K' D``.
(``benchmarks/cp_bytes.py`` checks these against the compiled HLO.)

Pure Ulysses (``ring_attention(..., strategy="ulysses")``, :func:`whole_sequence_attention`): the
exchange runs over the context-parallel axis itself (N devices) and no ring follows. After it a
device holds the whole sequence in layout order for H / N heads; it is put in natural order (a
local permutation, whose transpose is the inverse permutation, so gradients take no scatter-add),
attended with positions 0..L-1 in one step, and put back in layout order before the inverse
exchange.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ringattention import layouts


def axis_size(axis_name: str | tuple[str, ...], what: str = "ulysses_axis") -> int:
    """Size of a mesh axis bound by ``shard_map``; ValueError naming ``what`` if it is not bound."""
    try:
        return lax.psum(1, axis_name)
    except NameError:
        raise ValueError(
            f"{what}={axis_name!r} is not a mesh axis bound here (call inside "
            "jax.shard_map over a mesh that has it)"
        ) from None


def kv_repeats(heads: int, kv_heads: int, ulysses_size: int) -> int:
    """How many copies of each kv head the exchange needs (1 when ``ulysses_size`` divides K).

    ValueError unless ``ulysses_size`` divides the query heads.
    """
    if heads % ulysses_size:
        raise ValueError(
            f"query heads {heads} are not divisible by the Ulysses axis size "
            f"{ulysses_size}; Ulysses gives every device of its group heads/size heads"
        )
    return ulysses_size // math.gcd(kv_heads, ulysses_size)


def seq_to_heads(x: jax.Array, axis_name: str | tuple[str, ...]) -> jax.Array:
    """[B, S, H, D] sequence piece, all heads -> [B, U S, H / U, D] whole group sequence."""
    return lax.all_to_all(x, axis_name, split_axis=2, concat_axis=1, tiled=True)


def heads_to_seq(x: jax.Array, axis_name: str | tuple[str, ...]) -> jax.Array:
    """Inverse of :func:`seq_to_heads`: [B, U S, H / U, D] -> [B, S, H, D]."""
    return lax.all_to_all(x, axis_name, split_axis=1, concat_axis=2, tiled=True)


def ulysses_attention(
    ring: Callable,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None,
    ulysses_axis: str | tuple[str, ...],
    seq_axis: str | tuple[str, ...],
    sinks: jax.Array | None = None,
) -> jax.Array:
    """Runs ``ring(q, k, v, segment_ids)`` over ``seq_axis`` on heads exchanged over ``ulysses_axis``.

    q [B, S, H, D], k [B, S, K, D], v [B, S, K, Dv], segment_ids int [B, S] | None: this device's
    piece of the sequence (see the module docstring for the order). ``ring`` takes the exchanged
    [B, U S, H / U, D], [B, U S, K' / U, D], [B, U S, K' / U, Dv], [B, U S] and returns
    [B, U S, H / U, Dv]. ``sinks``: None or [H], one logit per query head: rank u's slice
    ``[u H / U, (u + 1) H / U)`` goes to ``ring`` as a fifth argument (its gradient flows back).
    Returns [B, S, H, Dv].
    """
    if ulysses_axis == seq_axis:
        raise ValueError(f"ulysses_axis={ulysses_axis!r} must differ from the ring's axis {seq_axis!r}")
    u = axis_size(ulysses_axis)
    if u == 1:
        return ring(q, k, v, segment_ids) if sinks is None else ring(q, k, v, segment_ids, sinks)
    reps = kv_repeats(q.shape[2], k.shape[2], u)
    if reps > 1:  # [B, S, K * reps, D]: kv head j's copies next to each other
        k, v = jnp.repeat(k, reps, axis=2), jnp.repeat(v, reps, axis=2)
    if segment_ids is not None:  # [B, U S]: ids of the whole ring shard, in rank order
        segment_ids = lax.all_gather(segment_ids, ulysses_axis, axis=1, tiled=True)
    q, k, v = (seq_to_heads(x, ulysses_axis) for x in (q, k, v))
    if sinks is None:
        return heads_to_seq(ring(q, k, v, segment_ids), ulysses_axis)
    return heads_to_seq(ring(q, k, v, segment_ids, _local_sinks(sinks, ulysses_axis, u)), ulysses_axis)


def _local_sinks(sinks: jax.Array, axis_name, n: int) -> jax.Array:
    """This rank's slice [H / n] of the sinks [H]: the heads it holds after the exchange."""
    per = sinks.shape[0] // n
    return lax.dynamic_slice_in_dim(sinks, lax.axis_index(axis_name) * per, per)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _reorder(x, layout: str, n: int, to_natural: bool):
    """[B, L, ...] layout order -> natural order (or back); the transpose is the inverse reorder."""
    perm = layouts.permutation(x.shape[1], layout, n)
    return jnp.take(x, jnp.asarray(np.argsort(perm) if to_natural else perm), axis=1)


def _reorder_fwd(x, layout, n, to_natural):
    return _reorder(x, layout, n, to_natural), None


def _reorder_bwd(layout, n, to_natural, _, g):
    return (_reorder(g, layout, n, not to_natural),)


_reorder.defvjp(_reorder_fwd, _reorder_bwd)


def whole_sequence_attention(
    attend: Callable,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None,
    axis_name: str | tuple[str, ...],
    layout: str,
    sinks: jax.Array | None = None,
) -> jax.Array:
    """Pure Ulysses over ``axis_name`` (N devices): ``attend`` sees the whole sequence.

    q [B, S, H, D], k [B, S, K, D], v [B, S, K, Dv], segment_ids int [B, S] | None: this device's
    shard, in ``layout`` order for a ring of N. ``attend(q, k, v, seg, sinks)`` takes
    [B, N S, H / N, D], [B, N S, K' / N, D], [B, N S, K' / N, Dv], [B, N S] in natural order and
    this rank's sinks [H / N] (None without ``sinks`` [H]), and returns [B, N S, H / N, Dv].
    Returns [B, S, H, Dv]. ValueError unless N divides H.
    """
    n = axis_size(axis_name, "axis_name")
    reps = kv_repeats(q.shape[2], k.shape[2], n)
    if reps > 1:  # [B, S, K * reps, D]
        k, v = jnp.repeat(k, reps, axis=2), jnp.repeat(v, reps, axis=2)
    natural = lambda x: _reorder(x, layout, n, True)  # noqa: E731
    if segment_ids is not None:  # [B, N S] natural order
        segment_ids = lax.all_gather(segment_ids, axis_name, axis=1, tiled=True)
        segment_ids = jnp.take(
            segment_ids, jnp.asarray(np.argsort(layouts.permutation(segment_ids.shape[1], layout, n))), axis=1
        )
    q, k, v = (natural(seq_to_heads(x, axis_name)) for x in (q, k, v))  # [B, N S, heads / N, .]
    local = None if sinks is None else _local_sinks(sinks, axis_name, n)
    o = _reorder(attend(q, k, v, segment_ids, local), layout, n, False)  # layout order
    return heads_to_seq(o, axis_name)
