"""``sharded_attention``: ring attention on *global* arrays, with the ``shard_map`` done for you.

Reorders the sequence into the chosen layout, shards it over the mesh's sequence axis (and optionally
batch and heads over other axes), runs :func:`ringattention.ring_attention` on every device and puts the
result back in natural order. With ``ulysses_axis`` the sequence is split over ``(seq_axis,
ulysses_axis)``, ring axis major, for 2-D context parallelism (``ringattention.ulysses``).
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from ringattention import _validate as checks
from ringattention import implementations, layouts
from ringattention import strategy as strategies
from ringattention.ring import ring_attention


def _check_axis(mesh: Mesh, name, what: str) -> int:
    if name is None:
        return 1
    if name not in mesh.shape:
        raise ValueError(f"{what}={name!r} is not an axis of the mesh; mesh.shape={dict(mesh.shape)}")
    return mesh.shape[name]


def _mesh_sizes(mesh: Mesh, seq_axis, ulysses_axis, batch_axis, head_axis) -> tuple[int, int, int, int]:
    """The sizes of the sequence, Ulysses, batch and head axes (1 for an axis not given)."""
    n = _check_axis(mesh, seq_axis, "seq_axis")
    nu = _check_axis(mesh, ulysses_axis, "ulysses_axis")
    if ulysses_axis is not None and ulysses_axis == seq_axis:
        raise ValueError(f"ulysses_axis={ulysses_axis!r} must differ from {seq_axis=}")
    return n, nu, _check_axis(mesh, batch_axis, "batch_axis"), _check_axis(mesh, head_axis, "head_axis")


def _check_ranks(q, k, v) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"q, k, v must be [batch, seq, heads, head_dim]; got {q.shape=} {k.shape=} {v.shape=}"
        )
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"k and v must agree in batch, seq and kv heads (v's head_dim may differ); "
            f"got {k.shape=} {v.shape=}"
        )


def _check_divisible(q, k, layout: str, names, sizes) -> None:
    """The sequence, batch and heads split evenly over the mesh axes ``names`` of ``sizes``."""
    seq_axis, ulysses_axis, batch_axis, head_axis = names
    n, nu, nb, nh = sizes
    layouts.check_divisible(q.shape[1], layout, n)
    if q.shape[1] % (n * nu):
        raise ValueError(f"sequence {q.shape[1]=} is not divisible by {seq_axis}={n} x {ulysses_axis}={nu}")
    if q.shape[0] % nb:
        raise ValueError(f"batch {q.shape[0]=} is not divisible by {batch_axis}={nb}")
    if q.shape[2] % nh or k.shape[2] % nh:
        raise ValueError(f"heads {q.shape[2]=} and kv heads {k.shape[2]=} must divide by {head_axis}={nh}")
    if (q.shape[2] // nh) % nu:
        raise ValueError(
            f"heads {q.shape[2]=} ({q.shape[2] // nh} per {head_axis}={nh} shard) are "
            f"not divisible by ulysses_axis {ulysses_axis}={nu}"
        )


def sharded_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mesh: Mesh,
    *,
    seq_axis: str = "sp",
    batch_axis: str | None = None,
    head_axis: str | None = None,
    segment_ids: jax.Array | None = None,
    causal: bool = False,
    layout: str = "contiguous",
    reorder: bool = True,
    deterministic: bool = False,
    ulysses_axis: str | None = None,
    sliding_window: int | None = None,
    sinks: jax.Array | None = None,
    logits_soft_cap: float | None = None,
    prefix_length: jax.Array | int | None = None,
    bidirectional_segments: bool = False,
    strategy: str = "ring",
    **kwargs: Any,
) -> jax.Array:
    """Ring attention over global arrays. q [B, L, H, D], k [B, L, K, D], v [B, L, K, Dv] ->
    [B, L, H, Dv] (Dv = D but for MLA shapes).

    ``seq_axis`` is the ring; ``batch_axis`` / ``head_axis`` optionally shard batch and heads (both H
    and K must divide by the head axis size). With ``reorder=True`` inputs and output are in natural
    order and the layout reordering is done here; with ``reorder=False`` they are already in layout
    order. ``deterministic`` picks kernels whose sums have a fixed order (see :func:`ring_attention`).
    ``ulysses_axis`` (size U) adds an all-to-all over heads around the ring: the sequence is
    split over ``(seq_axis, ulysses_axis)`` and the local heads H / ``head_axis`` must divide by U.
    ``sliding_window`` W: key j is visible to query i only if ``|i - j| < W`` (global
    positions). ``sinks`` [H] (sharded over ``head_axis``), ``logits_soft_cap``, ``prefix_length``
    (int or [B], sharded over ``batch_axis``) and ``bidirectional_segments`` as in
    :func:`ring_attention`. ``strategy``: "ring", "all_gather", "ulysses" or "auto" over
    ``seq_axis`` (``ringattention.strategy``). Other keyword arguments go to
    :func:`ring_attention`.
    """
    names = (seq_axis, ulysses_axis, batch_axis, head_axis)
    sizes = _mesh_sizes(mesh, *names)
    n = sizes[0]
    _check_ranks(q, k, v)
    causal = checks.causal(causal)
    checks.segment_ids(segment_ids, q.shape[:2])
    checks.sinks(sinks, q.shape[2])
    softcap = checks.logits_soft_cap(logits_soft_cap)
    prefix = checks.prefix_length(prefix_length, q.shape[0], causal)
    bidirectional = checks.bidirectional_segments(bidirectional_segments, causal, segment_ids)
    _check_divisible(q, k, layout, names, sizes)
    if reorder:
        q, k, v = (layouts.to_layout(x, layout, n) for x in (q, k, v))
        if segment_ids is not None:
            segment_ids = layouts.to_layout(segment_ids, layout, n)
    seq = seq_axis if ulysses_axis is None else (seq_axis, ulysses_axis)  # ring axis major
    spec = P(batch_axis, seq, head_axis, None)
    seg_spec = P(batch_axis, seq)
    strategies.check(strategy)
    used = {
        "softcap": softcap is not None,
        "prefix": prefix is not None,
        "bidirectional": bidirectional,
        "v_head_dim": v.shape[3] != q.shape[3],
    }
    step = q.shape[1] if strategy == "ulysses" else q.shape[1] // n  # keys one step attends to
    impl = implementations.resolve(
        kwargs.pop("implementation", "auto"),
        mesh,
        shard=step,
        needs=frozenset(f for f, on in used.items() if on),
    ).name

    def local(q, k, v, seg, snk, pre):
        return ring_attention(
            q,
            k,
            v,
            seq_axis,
            causal=causal,
            segment_ids=seg,
            layout=layout,
            implementation=impl,
            deterministic=deterministic,
            ulysses_axis=ulysses_axis,
            sliding_window=sliding_window,
            sinks=snk,
            logits_soft_cap=softcap,
            prefix_length=pre,
            bidirectional_segments=bidirectional,
            strategy=strategy,
            **kwargs,
        )

    specs = (spec, spec, spec, seg_spec, P(head_axis), P(batch_axis))
    out = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=spec)(q, k, v, segment_ids, sinks, prefix)
    return layouts.from_layout(out, layout, n) if reorder else out
