"""All-gather context parallelism: every device gathers all k/v instead of passing them around a ring.

Llama 3's context parallelism (Dubey et al. 2024, "The Llama 3 Herd of Models", §3.3.2) and
MaxText's default all-gather the keys and values over the context-parallel axis and attend each
query shard to the whole sequence: the same bytes as a ring (every device receives N - 1 k/v
shards), sent by one collective that need not hide behind a ring step's compute, at the price of
k/v for the whole sequence resident per device. This module is the ``strategy="all_gather"`` of
:func:`ringattention.ring_attention`; it reuses the ring's step implementations, global positions
per layout (``ring_step.step_args``), per-shard skip test (``ring_step.step_visible``) and
``ring_step.merge``, so causal masks, layouts, segment ids and sliding windows behave exactly as in
the ring, and the optional step features (soft-capping, prefix masks, bidirectional segments, v's
own head dim) reach every step as the ring passes them (``ring_step.step_kwargs``); sinks are
merged once after the lap (``ring._lap``).

Overlap. The shard is cut into ``cfg.gather_chunks`` pieces along the sequence; piece j is
all-gathered ([N, B, S / c, K, D]) before the compute on piece j - 1 is issued (piece 0 before the
device's own shard, which needs no collective), so XLA can run each gather behind the previous
piece's attention. Peak gathered k/v: two pieces, ``2 L / c`` tokens of k and v.

Backward: k/v are gathered again: the gathered copies are not residuals of the custom VJP, which
saves only q, k, v, segment ids, o and lse (O(S), whatever the remat policy). Where the forward and
the backward compile into one computation (a layer outside a ``lax.scan``, or one recomputed by
``jax.checkpoint`` inside the backward), XLA's CSE merges the backward's gathers with the forward's,
so the gathered k/v are sent once and stay alive from the forward to the backward; under a scanned
layer stack with ``ringattention.remat``'s policy they are sent again. dq accumulates locally;
dk/dv of every gathered shard of a piece are computed in float32 ([N, B, S / c, K, D]) and
``lax.psum_scatter`` returns each shard's sum to its owner, issued before the next piece's compute.

Bytes sent per device (elements of one k or v shard ``S K D``, times the dtype size b): forward
``(N - 1) 2 S K D b`` (an all-gather sends (N - 1) / N of its output); backward ``(N - 1) 2 S K D 4``
for the float32 reduce-scatter of dk/dv, plus the forward's bytes again where the gathers are not
merged (above). ``ringattention.strategy`` has the
cost model; ``benchmarks/cp_bytes.py`` checks these bytes against the compiled HLO.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ringattention import implementations
from ringattention._vma import full_like
from ringattention.ring_step import merge, step_args, step_kwargs, step_visible


def _pieces(cfg, x):
    """[B, S, ...] -> ``cfg.gather_chunks`` pieces [B, S / c, ...] (None stays None)."""
    if x is None:
        return [None] * cfg.gather_chunks
    return jnp.split(x, cfg.gather_chunks, axis=1)


def _gather(cfg, piece):
    """All-gathers a (k, v, k_seg) piece over the ring axis: each [N, B, S / c, ...]."""
    return jax.tree.map(lambda a: lax.all_gather(a, cfg.axis_name, axis=0), piece)


def _step_inputs(cfg, q, q_seg, k_seg, src, j: int, c: int):
    """Global positions (and tied segment ids) of this shard and of piece j (of c) of shard ``src``."""
    r = lax.axis_index(cfg.axis_name)
    size = q.shape[1] // c
    q_pos, k_pos, qs, ks = step_args(cfg, q, q_seg, k_seg, (r - src) % cfg.ring_size)
    k_pos = k_pos[j * size : (j + 1) * size]  # [S / c]
    return q_pos, k_pos, qs, ks


def _visible(cfg, q_pos, k_pos, qs, ks, src, prefix):
    """The ring's skip test, and never the own shard (computed first, from the local k/v)."""
    own = src == lax.axis_index(cfg.axis_name)
    return step_visible(cfg, q_pos, k_pos, qs, ks, prefix) & ~own


def _schedule(cfg, kv, own, piece, acc):
    """Runs ``own`` then ``piece`` on every gathered piece, each gather issued one compute early.

    kv: (k, v, k_seg) of this shard; own(acc) -> acc; piece(acc, gathered, j) -> (acc, out_j).
    Returns (acc, [out_j for every piece])."""
    kv_pieces = list(zip(*(_pieces(cfg, x) for x in kv)))
    nxt = _gather(cfg, kv_pieces[0])  # issued before the own shard's compute
    acc = own(acc)
    outs = []
    for j in range(cfg.gather_chunks):
        gathered = nxt
        if j + 1 < cfg.gather_chunks:
            nxt = _gather(cfg, kv_pieces[j + 1])  # issued before piece j's compute
        acc, out = piece(acc, gathered, j)
        outs.append(out)
    return acc, outs


def forward(cfg, q, k, v, q_seg, k_seg, prefix=None):
    """o float32 [B, S, H, Dv] and lse float32 [B, H, S] of q against every device's k/v.
    ``prefix``: None or int32 [B], the ring's prefix_length (a step feature, as in ring.py)."""
    impl = implementations.resolve(cfg.implementation).load()
    B, S, H, _ = q.shape
    kw = step_kwargs(cfg, prefix)
    empty = lambda: (
        full_like(q, (B, S, H, v.shape[-1]), 0.0),  # noqa: E731
        full_like(q, (B, H, S), -jnp.inf),
    )

    def compute(kv, src, j, c):  # (the step as a thunk, whether it is needed)
        k_, v_, ks = kv
        q_pos, k_pos, qs, ks = _step_inputs(cfg, q, q_seg, ks, src, j, c)
        run = lambda: impl.forward_step(q, k_, v_, q_pos, k_pos, qs, ks, **kw)  # noqa: E731
        return run, _visible(cfg, q_pos, k_pos, qs, ks, src, prefix)

    def own(_):
        return compute((k, v, k_seg), lax.axis_index(cfg.axis_name), 0, 1)[0]()

    def piece(acc, gathered, j):
        def body(carry, x):
            run, vis = compute(x[:3], x[3], j, cfg.gather_chunks)
            return merge(*carry, *lax.cond(vis, run, empty)), None

        acc, _ = lax.scan(body, acc, (*gathered, jnp.arange(cfg.ring_size)))
        return acc, None

    (o, lse), _ = _schedule(cfg, (k, v, k_seg), own, piece, None)
    return o, lse


def backward(cfg, q, k, v, q_seg, k_seg, do, lse, delta, prefix=None):
    """float32 dq [B, S, H, D], dk [B, S, K, D], dv [B, S, K, Dv]: dk/dv of every shard
    reduce-scattered home."""
    impl = implementations.resolve(cfg.implementation).load()
    kw = step_kwargs(cfg, prefix)

    def compute(kv, src, j, c):
        k_, v_, ks = kv
        q_pos, k_pos, qs, ks = _step_inputs(cfg, q, q_seg, ks, src, j, c)
        run = lambda: impl.backward_step(
            q,
            k_,
            v_,
            do,
            lse,
            delta,
            q_pos,
            k_pos,
            qs,
            ks,  # noqa: E731
            **kw,
        )
        empty = lambda: tuple(full_like(q, x.shape, 0.0) for x in (q, k_, v_))  # noqa: E731
        return run, empty, _visible(cfg, q_pos, k_pos, qs, ks, src, prefix)

    def own(_):  # -> (dq, dk, dv) of the own shard
        return compute((k, v, k_seg), lax.axis_index(cfg.axis_name), 0, 1)[0]()

    def piece(acc, gathered, j):
        def body(dq, x):
            run, empty, vis = compute(x[:3], x[3], j, cfg.gather_chunks)
            dq_s, dk_s, dv_s = lax.cond(vis, run, empty)
            return dq + dq_s, (dk_s, dv_s)  # [N, B, S / c, K, D] each, stacked by the scan

        dq, dkv = lax.scan(body, acc[0], (*gathered, jnp.arange(cfg.ring_size)))
        # each shard's piece sums to its owner: [B, S / c, K, D]
        return (dq, *acc[1:]), tuple(lax.psum_scatter(g, cfg.axis_name, scatter_dimension=0) for g in dkv)

    (dq, dk_own, dv_own), outs = _schedule(cfg, (k, v, k_seg), own, piece, None)
    dk = dk_own + jnp.concatenate([d for d, _ in outs], axis=1)  # [B, S, K, D]
    dv = dv_own + jnp.concatenate([d for _, d in outs], axis=1)
    return dq, dk, dv
