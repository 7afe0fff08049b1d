"""Ring attention: exact attention over a sequence sharded across a ring of devices.

Each device keeps its query shard and passes key/value shards (and their segment ids) around the ring
with ``lax.ppermute``, merging every step's partial result with a float32 log-sum-exp (Ring Attention
with Blockwise Transformers, Liu, Zaharia & Abbeel 2023). The backward pass is a second lap that
recomputes scores from the saved lse: dq accumulates locally, dk/dv accumulate in float32 while they
travel with k/v and arrive home after a full lap. Residuals are O(shard).

Every ppermute is issued at the top of a step, before the compute it should hide behind. The step's
inner loop is pluggable (``implementations.py``): pure-JAX blockwise or a Pallas kernel.

Sliding windows (``|i - j| < W``, Mistral style; Jiang et al. 2023) shorten the lap where the layout
allows: the ring offsets whose shards some query can see are found at trace time (``lap_plan.py``) and
only those are visited, ``f`` hops forward and ``b`` hops backward (contiguous, causal, W <= shard:
one hop; symmetric windows and zigzag: one each way). In the backward pass dk/dv travel with their
shard and take one ppermute home at the end of each half-lap. Striped shards hold positions from the
whole sequence, so their lap stays full: only steps and blocks outside the window are skipped.

Optional features: attention sinks (gpt-oss model card 2025; Xiao et al. 2023) are merged into the
float32 lse once, after the forward lap (``sinks.py``), and never reach the steps; logit soft-capping
(Gemma 2, Gemma Team 2024), a bidirectional prefix per row, bidirectional segments and a value head
dim of its own are step features (``implementations.FEATURES``), passed only when used, and "auto"
picks an implementation that has them all.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from ringattention import _validate as _checks
from ringattention import all_gather, implementations, layouts, ulysses
from ringattention import sinks as _sinks
from ringattention import strategy as strategies
from ringattention._vma import full_like, vary_like
from ringattention.lap_plan import window_plan
from ringattention.remat import LSE_NAME, OUT_NAME
from ringattention.ring_step import merge, step_args, step_kwargs, step_visible

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class _Config:
    axis_name: object
    causal: bool
    layout: str
    softmax_scale: float
    implementation: str
    block_sizes: object
    interpret: bool
    ring_size: int
    window: int | None = None  # sliding window (None: none)
    hops: tuple[int, int] | None = None  # (forward, backward) hops of a short lap; None: a full lap
    strategy: str = "ring"  # or "all_gather" (ringattention/all_gather.py)
    gather_chunks: int = 1  # all_gather: pieces of the shard gathered one by one
    softcap: float | None = None  # logits_soft_cap (None: none)
    prefix: bool = False  # a prefix_length int32 [B] argument is passed to _ring
    bidirectional: bool = False  # negative segment ids are bidirectional segments

    @property
    def one_sided(self) -> bool:
        """Causal with no key after a query visible (no prefix, no bidirectional segments)."""
        return self.causal and not (self.prefix or self.bidirectional)


def _features(cfg, q, v) -> frozenset[str]:
    """The optional step features (``implementations.FEATURES``) this call uses."""
    used = {
        "softcap": cfg.softcap is not None,
        "prefix": cfg.prefix,
        "bidirectional": cfg.bidirectional,
        "v_head_dim": v.shape[-1] != q.shape[-1],
    }
    return frozenset(name for name, on in used.items() if on)


def _send(cfg, x, shift: int = 1):
    perm = [(i, (i + shift) % cfg.ring_size) for i in range(cfg.ring_size)]
    return jax.tree.map(lambda a: lax.ppermute(a, cfg.axis_name, perm), x)


def _directions(cfg):
    """(shift, hops) of each half-lap: a full lap is n - 1 hops forward."""
    fwd, bwd = cfg.hops if cfg.hops is not None else (cfg.ring_size - 1, 0)
    return tuple((d, m) for d, m in ((1, fwd), (-1, bwd)) if m)


def _forward_lap(cfg, q, k, v, q_seg, k_seg, prefix=None, out_dtype=None):
    """Returns o float32 [B, S, H, Dv] and lse float32 [B, H, S] over the ring (or its short lap).
    ``out_dtype``: o's dtype where the lap is one step (a ring of one device) of an implementation
    that takes it (``Implementation.out_dtype``): nothing is merged, so the kernel writes it."""
    impl_info = implementations.resolve(cfg.implementation)
    impl = impl_info.load()
    n = cfg.ring_size
    kw = step_kwargs(cfg, prefix)
    if n == 1 and out_dtype is not None and impl_info.out_dtype:
        kw["out_dtype"] = out_dtype

    def compute(kv, t):
        k_, v_, ks = kv
        q_pos, k_pos, qs, ks = step_args(cfg, q, q_seg, ks, t)
        run = lambda: impl.forward_step(q, k_, v_, q_pos, k_pos, qs, ks, **kw)  # noqa: E731
        if n == 1:
            return run()
        B, S, H, _ = q.shape
        empty = lambda: (
            full_like(q, (B, S, H, v.shape[-1]), 0.0),  # noqa: E731
            full_like(q, (B, H, S), -jnp.inf),
        )
        return lax.cond(step_visible(cfg, q_pos, k_pos, qs, ks, prefix), run, empty)

    kv = (k, v, k_seg)
    if n == 1:
        return compute(kv, 0)
    dirs = _directions(cfg)
    sent = [_send(cfg, kv, d) for d, _ in dirs]  # issued before the step-0 compute they hide behind
    o, lse = compute(kv, 0)
    for (d, m), nxt in zip(dirs, sent):
        o, lse = _forward_hops(cfg, compute, o, lse, nxt, d, m)
    return o, lse


def _forward_hops(cfg, compute, o, lse, kv, d: int, m: int):
    """Merges the shards at offsets d, 2d, ..., md into (o, lse); ``kv`` (offset d) is on its way."""

    def body(carry, h):
        o, lse, kv = carry
        nxt = _send(cfg, kv, d)
        o, lse = merge(o, lse, *compute(kv, d * h))
        return (o, lse, nxt), None

    if m > 1:
        (o, lse, kv), _ = lax.scan(body, (o, lse, kv), jnp.arange(1, m))
    return merge(o, lse, *compute(kv, d * m))


def _backward_lap(cfg, q, k, v, q_seg, k_seg, do, lse, delta, prefix=None):
    """Returns float32 dq, dk, dv; dk/dv travel with k/v and return home at the end of a half-lap."""
    impl = implementations.resolve(cfg.implementation).load()
    n = cfg.ring_size
    kw = step_kwargs(cfg, prefix)

    def compute(kv, t):
        k_, v_, ks = kv
        q_pos, k_pos, qs, ks = step_args(cfg, q, q_seg, ks, t)
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
        if n == 1:
            return run()
        empty = lambda: tuple(full_like(q, x.shape, 0.0) for x in (q, k_, v_))  # noqa: E731
        return lax.cond(step_visible(cfg, q_pos, k_pos, qs, ks, prefix), run, empty)

    kv = (k, v, k_seg)
    if n == 1:
        return compute(kv, 0)
    dirs = _directions(cfg)
    sent = [_send(cfg, kv, d) for d, _ in dirs]
    dq, dk, dv = compute(kv, 0)
    acc = (dk, dv)  # of the own shard; each half-lap carries it along and brings it home
    for (d, m), nxt in zip(dirs, sent):
        dq, acc = _backward_hops(cfg, compute, dq, nxt, acc, d, m)
    return (dq, *acc)


def _backward_hops(cfg, compute, dq, kv, acc, d: int, m: int):
    """Adds the steps at offsets d, ..., md to dq and to the travelling dk/dv (``acc``: the own
    shard's at offset 0). Returns dq and the own shard's dk/dv, home again."""

    def body(carry, h):
        dq, kv, acc = carry  # acc: (dk, dv) of the shard held at hop h - 1
        nxt = _send(cfg, kv, d)
        dk_in, dv_in = _send(cfg, acc, d)  # that shard's accumulator moves on with it
        dq_s, dk_s, dv_s = compute(kv, d * h)
        return (dq + dq_s, nxt, (dk_in + dk_s, dv_in + dv_s)), None

    if m > 1:
        (dq, kv, acc), _ = lax.scan(body, (dq, kv, acc), jnp.arange(1, m))
    dk_in, dv_in = _send(cfg, acc, d)
    dq_s, dk_s, dv_s = compute(kv, d * m)
    home = _send(cfg, (dk_in + dk_s, dv_in + dv_s), -d * m)  # to the shard's owner (full lap: +1)
    return dq + dq_s, home


def _laps(cfg):
    """(forward, backward) lap of the config's strategy: the ring's, or all_gather.py's."""
    if cfg.strategy == "all_gather" and cfg.ring_size > 1:
        return all_gather.forward, all_gather.backward
    return _forward_lap, _backward_lap


def _lap(cfg, q, k, v, segment_ids, prefix, sink_logits):
    fwd = _laps(cfg)[0]
    # o in q's dtype straight from a lone step's kernel (no float32 write, no conversion after);
    # sinks are merged into a float32 o
    kw = dict(out_dtype=q.dtype) if fwd is _forward_lap and sink_logits is None else {}
    o, lse = fwd(cfg, q, k, v, segment_ids, segment_ids, prefix, **kw)
    if sink_logits is not None:  # once, into the float32 lse (sinks.py)
        o, lse = _sinks.merge(o, lse, sink_logits)
    return o, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _ring(q, k, v, segment_ids, prefix, sink_logits, cfg):
    o, _ = _lap(cfg, q, k, v, segment_ids, prefix, sink_logits)
    return o.astype(q.dtype)


def _ring_fwd(q, k, v, segment_ids, prefix, sink_logits, cfg):
    # o and lse carry names so that a remat policy (ringattention.remat) can keep them and the
    # backward pass of a rematerialised block need not run the forward lap again.
    o, lse = _lap(cfg, q, k, v, segment_ids, prefix, sink_logits)
    o = checkpoint_name(o.astype(q.dtype), OUT_NAME)
    lse = checkpoint_name(lse, LSE_NAME)
    return o, (q, k, v, segment_ids, prefix, sink_logits, o, lse)


def _ring_bwd(cfg, res, do):
    q, k, v, segment_ids, prefix, sink_logits, o, lse = res  # lse: with the sinks merged in
    delta = jnp.einsum("bshd,bshd->bhs", o.astype(F32), do.astype(F32))  # [B, H, S]
    dq, dk, dv = _laps(cfg)[1](cfg, q, k, v, segment_ids, segment_ids, do.astype(q.dtype), lse, delta, prefix)
    dsinks = None if sink_logits is None else _sinks.grad(sink_logits, lse, delta)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, dsinks


_ring.defvjp(_ring_fwd, _ring_bwd)


def _validate(q, k, v, segment_ids, layout, softmax_scale, sliding_window=None):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(
                f"{name} must be [batch, shard, heads, head_dim]; got {name}.shape="
                f"{getattr(x, 'shape', None)}"
            )
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{name} must be floating point; got {name}.dtype={x.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype; got {q.dtype=} {k.dtype=} {v.dtype=}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"k and v must agree in batch, shard length and kv heads (v's head_dim may "
            f"differ); got {k.shape=} {v.shape=}"
        )
    if q.shape[0] != k.shape[0] or q.shape[1] != k.shape[1] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must agree in batch, shard length and head_dim; got {q.shape=} {k.shape=}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads must be a multiple of kv heads; got {q.shape[2]=} {k.shape[2]=}")
    layouts.check_layout(layout)
    _checks.segment_ids(segment_ids, q.shape[:2], dims="[batch, shard]")
    _checks.softmax_scale(softmax_scale)
    _checks.sliding_window(sliding_window)


def _check_platform(impl, interpret: bool) -> None:
    """The kernel must run on the platform of the mesh being traced (not the host's backend)."""
    mesh_platform = implementations.platform()
    if not interpret and mesh_platform not in impl.platforms:
        raise ValueError(
            f"implementation={impl.name!r} runs on {impl.platforms}, not on this "
            f"mesh's platform={mesh_platform!r}; pass interpret=True to emulate it, "
            "or use 'auto'/'xla'"
        )


def _axis_size(axis_name, argument: str = "axis_name") -> int:
    """The size of a mesh axis bound by the enclosing shard_map; ValueError naming ``argument``."""
    try:
        return lax.psum(1, axis_name)
    except NameError as e:
        raise ValueError(
            f"{argument}={axis_name!r} is not an axis of the enclosing shard_map ({e})"
        ) from None


def _ring_shard(q, layout: str, ring_size: int, u: int | None, strategy: str, gather_chunks) -> int:
    """The ring's shard length (with Ulysses, the U pieces of the Ulysses group), after checking
    ``gather_chunks`` against the strategy and a zigzag shard's parity."""
    if gather_chunks is not None and strategy in ("ring", "ulysses"):
        raise ValueError(
            f"gather_chunks={gather_chunks!r} applies to strategy='all_gather' (or "
            f"'auto' where it picks all_gather); got strategy={strategy!r}"
        )
    shard = q.shape[1] * (u or 1)
    if layout == "zigzag" and ring_size > 1 and shard % 2:
        raise ValueError(
            f"zigzag needs an even shard length on a ring of {ring_size}; got "
            f"{q.shape[1]=} (x {shard // q.shape[1]} Ulysses pieces)"
        )
    return shard


def _configure(
    cfg,
    q,
    v,
    step: int,
    shard: int,
    implementation,
    block_sizes,
    deterministic,
    softmax_scale,
    sliding_window,
):
    """``cfg`` completed for a step over ``step`` keys: the implementation (checked against the
    mesh's platform), its block sizes, the softmax scale and the window's plan; and the
    implementation."""
    impl = implementations.resolve(implementation, shard=step, needs=_features(cfg, q, v))
    _check_platform(impl, cfg.interpret)
    if deterministic:
        block_sizes = implementations.deterministic_block_sizes(
            impl, block_sizes, q.shape[-1], cfg.causal, v_head_dim=v.shape[-1]
        )
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    window, hops = window_plan(sliding_window, cfg.layout, cfg.ring_size, shard, cfg.one_sided)
    cfg = dataclasses.replace(
        cfg, softmax_scale=scale, implementation=impl.name, block_sizes=block_sizes, window=window, hops=hops
    )
    return cfg, impl


def _whole_sequence(cfg, sliding_window, step: int):
    """The config of Ulysses' one step over the whole sequence (``step`` keys), in natural order."""
    window, hops = window_plan(sliding_window, "contiguous", 1, step, cfg.one_sided)
    return dataclasses.replace(cfg, layout="contiguous", ring_size=1, window=window, hops=hops)


def ring_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    axis_name: str | tuple[str, ...],
    *,
    causal: bool = False,
    segment_ids: jax.Array | None = None,
    layout: str = "contiguous",
    softmax_scale: float | None = None,
    implementation: str = "auto",
    block_sizes: Any = None,
    interpret: bool = False,
    deterministic: bool = False,
    ulysses_axis: str | tuple[str, ...] | None = None,
    sliding_window: int | None = None,
    sinks: jax.Array | None = None,
    logits_soft_cap: float | None = None,
    prefix_length: jax.Array | int | None = None,
    bidirectional_segments: bool = False,
    strategy: str = "ring",
    gather_chunks: int | None = None,
) -> jax.Array:
    """Exact attention over a sequence sharded along mesh axis ``axis_name`` (inside ``shard_map``).

    Args:
      q: [batch, q_shard, heads, head_dim], this device's query shard in ``layout`` order.
      k, v: [batch, kv_shard, kv_heads, head_dim] with ``heads % kv_heads == 0`` (GQA/MQA); only the kv
        heads travel around the ring. ``kv_shard == q_shard``. v may have its own head dim
        (v [batch, kv_shard, kv_heads, v_head_dim], MLA shapes); the output then has it too.
      axis_name: the mesh axis (bound by ``shard_map``) along which the sequence is sharded, or a
        tuple of axes that together form one ring (the first axis major, as ``lax.axis_index``).
      causal: a key is visible only if its global position is <= the query's.
      segment_ids: None or int [batch, q_shard], this shard of the global ids; a query sees a key only
        if their ids are equal. Key ids travel with k/v.
      layout: "contiguous", "striped" or "zigzag" (see ``ringattention.layouts``).
      softmax_scale: defaults to ``head_dim ** -0.5``.
      implementation: "auto", "xla", or a registered kernel ("pallas_gpu", ...).
      block_sizes: the implementation's ``BlockSizes`` (None: its defaults).
      interpret: run Pallas kernels in interpret mode (CPU tests).
      deterministic: run kernels whose sums have a fixed order, so that the output and gradients are
        bitwise reproducible (``implementations.deterministic_block_sizes``; on pallas_hopper the
        two-kernel backward instead of the fused one: 0.93-1.02x its speed on an H200 at head
        dims 64-128). XLA's own GPU ops (the scatter of an embedding gradient, autotuned GEMMs)
        also need the process started with
        ``XLA_FLAGS=--xla_gpu_deterministic_ops=true``; ``python -m train`` sets it when the
        config says ``deterministic: true``.
      ulysses_axis: None, or a second mesh axis of size U for 2-D context parallelism
        (``ringattention.ulysses``): the shards are pieces of the sequence split over
        ``(axis_name, ulysses_axis)``, ring axis major; an all-to-all over ``ulysses_axis`` trades
        them for whole ring shards of heads / U heads, the ring runs on those, and a second
        all-to-all returns the output. ``heads % U == 0``; kv heads are repeated as needed.
      sliding_window: None or W > 0: a key is visible only if ``|i - j| < W`` for global positions
        i (query) and j (key), on top of ``causal`` and ``segment_ids`` (Mistral: causal, W).
        Steps and blocks outside the window are skipped; contiguous (and zigzag / symmetric) rings
        visit only the shards the window reaches (see the module docstring).
      sinks: None or float [heads]: one learned logit per query head added to the softmax
        denominator with no value (gpt-oss); differentiable. Merged into the lse after the lap, so
        every implementation takes it.
      logits_soft_cap: None or C > 0: scores become ``C * tanh(softmax_scale * q.k / C)`` before
        masking (Gemma 2).
      prefix_length: None, or int [batch] (a Python int: the same for every row) with causal=True:
        keys at global positions < prefix_length[b] are visible to every query of row b (prefix LM).
      bidirectional_segments: with causal=True and segment_ids, segments with negative ids are
        bidirectional (their queries see every key of their segment).
      strategy: how k/v reach the queries over ``axis_name`` (``ringattention.strategy``): "ring"
        (ppermute around the ring), "all_gather" (gather all k/v, attend, reduce-scatter dk/dv;
        ``ringattention.all_gather``), "ulysses" (all-to-all of heads, whole-sequence attention on
        heads / N heads; needs ``heads % N == 0``) or "auto" (the cost model's choice for these
        shapes on the mesh's platform). All are exact and take every mask; with ``ulysses_axis``
        only "ring", "all_gather" and "auto" (which then picks between those two).
      gather_chunks: "all_gather": the shard is gathered in this many pieces, each gather issued
        before the compute on the previous piece (None: 2 where the shard halves, else 1).

    Returns:
      [batch, q_shard, heads, v_head_dim] in ``q.dtype``.
    """
    causal = _checks.causal(causal)
    _validate(q, k, v, segment_ids, layout, softmax_scale, sliding_window)
    _checks.sinks(sinks, q.shape[2])
    softcap = _checks.logits_soft_cap(logits_soft_cap)
    prefix = _checks.prefix_length(prefix_length, q.shape[0], causal)
    bidirectional = _checks.bidirectional_segments(bidirectional_segments, causal, segment_ids)
    ring_size = _axis_size(axis_name)
    u = None if ulysses_axis is None else _axis_size(ulysses_axis, "ulysses_axis")
    shard = _ring_shard(q, layout, ring_size, u, strategy, gather_chunks)
    cfg = _Config(
        axis_name,
        bool(causal),
        layout,
        1.0,
        "",
        None,
        bool(interpret),
        ring_size,
        softcap=softcap,
        prefix=prefix is not None,
        bidirectional=bidirectional,
    )
    strategy = strategies.resolve(
        strategy,
        q.shape,
        k.shape,
        q.dtype.itemsize,
        axis_name,
        ring_size,
        u,
        cfg.one_sided,
        implementations.mesh_device(),
        layout=layout,
        window=sliding_window,
        v_head_dim=v.shape[-1],
    )
    step = shard * ring_size if strategy == "ulysses" else shard  # keys a step attends to
    cfg, impl = _configure(
        cfg, q, v, step, shard, implementation, block_sizes, deterministic, softmax_scale, sliding_window
    )
    if segment_ids is not None:
        segment_ids = segment_ids.astype(jnp.int32)
    if sinks is not None:  # varying like q: its cotangent, per device, is summed by the transpose
        sinks = vary_like(sinks, q)
    if strategy == "ulysses":  # one step over the whole sequence, in natural order
        whole = _whole_sequence(cfg, sliding_window, step)
        attend = lambda q, k, v, seg, snk=None: _ring(q, k, v, seg, prefix, snk, whole)  # noqa: E731
        return ulysses.whole_sequence_attention(attend, q, k, v, segment_ids, axis_name, layout, sinks=sinks)
    if strategy == "all_gather":
        cfg = dataclasses.replace(
            cfg,
            strategy=strategy,
            gather_chunks=strategies.gather_chunks(gather_chunks, shard, impl.takes_shard),
        )
    ring = lambda q, k, v, seg, snk=sinks: _ring(q, k, v, seg, prefix, snk, cfg)  # noqa: E731
    if ulysses_axis is not None:  # 2-D context parallelism (ringattention/ulysses.py)
        return ulysses.ulysses_attention(ring, q, k, v, segment_ids, ulysses_axis, axis_name, sinks=sinks)
    return ring(q, k, v, segment_ids)
