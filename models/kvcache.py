"""A key/value cache sharded along the sequence over the "sp" ring, and attention of new queries to it.

Ring Attention with Blockwise Transformers (Liu, Zaharia & Abbeel 2023) prefills a long prompt with
the sequence sharded over a ring of devices; its reference decoder (Large World Model, Liu et al.
2024) then rotates the whole cache around the ring for every new token. Here the cache stays put:

- Every device keeps its shard of keys/values in the ring layout's order (the order in which
  prefill leaves them), preallocated to the cache length ``T`` so that every step has one shape.
- New queries attend to each device's local shard (masking slots at positions >= the sequence's
  length), giving partial ``(o, lse)``; the partials are merged across "sp" with a ``pmax`` of the
  lse and one ``psum`` of the exp-weighted outputs and weights (:func:`cache_attention`). The new
  tokens' own keys are merged afterwards, on every device (:func:`chunk_attention`).
- A new key goes to the shard that owns its position (:func:`slot`); only that device writes it.
- With a sliding window W (Mistral) a query at position p also masks the cached positions <= p - W;
  the cache keeps them (it is not a rolling buffer), so memory is that of full attention.

:func:`rotating_cache_attention` is the per-token rotation baseline (for the benchmark and tests).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from einops import rearrange
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from models.config import LlamaConfig
from models.sharding import BATCH, axis_size
from ringattention import implementations, layouts
from ringattention.blockwise import BlockSizes
from ringattention.ring import merge

F32 = jnp.float32
CACHE_SPEC = P(None, BATCH, "sp", "tp", None)  # [layers, batch, seq (layout order), kv_heads, dim]


@dataclasses.dataclass
class KVCache:
    """Keys/values of every layer, sequence in ``layout`` order for a ring of ``ring`` shards.

    k, v: [layers, batch, T, kv_heads, head_dim] (sharded ``CACHE_SPEC`` on a mesh); lengths: int32
    [batch], the number of filled positions of each sequence (positions ``0 .. lengths-1``).
    """

    k: jax.Array
    v: jax.Array
    lengths: jax.Array
    layout: str = "zigzag"
    ring: int = 1

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @property
    def shard_len(self) -> int:
        return self.k.shape[2] // self.ring

    def nbytes_per_device(self) -> int:
        """Bytes of k and v held by one device (its sequence shard; batch/heads unsharded)."""
        return 2 * math.prod(self.k.shape) * self.k.dtype.itemsize // self.ring


jax.tree_util.register_dataclass(KVCache, data_fields=["k", "v", "lengths"], meta_fields=["layout", "ring"])


def granularity(layout: str, ring: int) -> int:
    """Cache lengths must be multiples of this (the layout's number of chunks)."""
    return layouts.parts(layout, ring)


def slot(pos: jax.Array, layout: str, shard_len: int, ring: int) -> tuple[jax.Array, jax.Array]:
    """(owner device, index within its shard) of global positions ``pos`` (int32, any shape)."""
    pos = pos.astype(jnp.int32)
    if layout == "contiguous" or ring == 1:  # a ring of one: natural order under every layout
        return pos // shard_len, pos % shard_len
    if layout == "striped":
        return pos % ring, pos // ring
    half = shard_len // 2
    chunk = pos // half
    first = chunk < ring
    owner = jnp.where(first, chunk, 2 * ring - 1 - chunk)
    return owner, jnp.where(first, pos % half, half + pos % half)


def check_decodable(config: LlamaConfig) -> None:
    """Raises ValueError for a model that decoding does not support: families other than
    LLaMA/Mistral, and v's own head dim (the cache and its kernels hold one head dim)."""
    if config.family != "llama":
        raise ValueError(
            f"KV-cache decoding supports LLaMA and Mistral only; family="
            f"{config.family!r} ({_FAMILY_OPTIONS[config.family]}) is forward / loss only"
        )
    if config.v_dim != config.head_dim:
        raise ValueError(
            f"KV-cache decoding needs v_head_dim == head_dim; got v_head_dim="
            f"{config.v_head_dim} != head_dim={config.head_dim} (MLA shapes are "
            "forward / loss only)"
        )


_FAMILY_OPTIONS = {
    "qwen3": "q/k norms",
    "gemma2": "soft caps, per-layer windows",
    "gpt_oss": "attention sinks, experts",
}


def check_cache_mesh(config: LlamaConfig, mesh: Mesh | None, batch: int, max_len: int) -> None:
    """Raises ValueError unless a [batch, max_len] cache fits ``mesh`` and ``config.layout``."""
    check_decodable(config)
    n = axis_size(mesh, "sp")
    layouts.check_divisible(max_len, config.layout, n)
    if max_len % (n * axis_size(mesh, "usp")):  # the prefill's sequence is split over sp and usp
        raise ValueError(f"{max_len=} must be divisible by sp*usp={n * axis_size(mesh, 'usp')}")
    nb = axis_size(mesh, "dp") * axis_size(mesh, "fsdp")
    if batch % nb:
        raise ValueError(f"batch={batch} must be divisible by dp*fsdp={nb}")
    if config.num_kv_heads % axis_size(mesh, "tp"):
        raise ValueError(
            f"num_kv_heads={config.num_kv_heads} must be divisible by tp={axis_size(mesh, 'tp')}"
        )


def cache_sharding(mesh: Mesh | None) -> NamedSharding | None:
    return None if mesh is None else NamedSharding(mesh, CACHE_SPEC)


def to_natural(cache: KVCache) -> tuple[jax.Array, jax.Array]:
    """The cache's k, v with the sequence axis in natural (position) order."""
    back = lambda x: layouts.from_layout(x, cache.layout, cache.ring, axis=2)  # noqa: E731
    return back(cache.k), back(cache.v)


def _run_sharded(fn, mesh: Mesh | None, in_specs, out_specs, *args):
    """``fn`` under shard_map over ``mesh``, or as a ring of one (vmap over "sp") without a mesh."""
    if mesh is None:
        add = lambda x: x[None]  # noqa: E731
        out = jax.vmap(fn, axis_name="sp", axis_size=1)(*map(add, args))
        return jax.tree.map(lambda x: x[0], out)
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs)(*args)


def dense_partial(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float
) -> tuple[jax.Array, jax.Array]:
    """Attention of q [B, C, H, D] to k/v [B, S, K, D] under mask [B, C, S].

    Returns o float32 [B, C, H, D] (0 where nothing is visible) and lse float32 [B, H, C] (-inf).
    """
    K = k.shape[2]
    qg = rearrange(q, "b c (k g) d -> b c k g d", k=K)
    s = jnp.einsum("bckgd,bskd->bkgcs", qg, k, preferred_element_type=F32) * scale  # [B,K,G,C,S]
    s = jnp.where(mask[:, None, None], s, -jnp.inf)
    m = s.max(-1, keepdims=True)
    m_safe = jnp.where(jnp.isneginf(m), 0.0, m)
    p = jnp.exp(s - m_safe)  # 0 where masked
    l = p.sum(-1, keepdims=True)  # noqa: E741  [B, K, G, C, 1]
    o = jnp.einsum("bkgcs,bskd->bckgd", p.astype(v.dtype), v, preferred_element_type=F32)
    inv = jnp.where(l > 0, 1.0 / jnp.where(l > 0, l, 1.0), 0.0)  # [B, K, G, C, 1]
    o = o * jnp.moveaxis(inv[..., 0], 3, 1)[..., None]  # [B, C, K, G, D]
    lse = jnp.where(
        l[..., 0] > 0, m_safe[..., 0] + jnp.log(jnp.where(l > 0, l, 1.0)[..., 0]), -jnp.inf
    )  # [B, K, G, C]
    return rearrange(o, "b c k g d -> b c (k g) d"), rearrange(lse, "b k g c -> b (k g) c")


def _allreduce_merge(o, lse, axis_name):
    """Exact merge of per-device partials: pmax of lse, then one psum of weighted parts."""
    m = lax.pmax(lse, axis_name)  # [B, H, C]
    m_safe = jnp.where(jnp.isneginf(m), 0.0, m)
    w = jnp.exp(lse - m_safe)  # [B, H, C], 0 for devices that saw nothing
    wo = o * jnp.swapaxes(w, 1, 2)[..., None]  # [B, C, H, D]
    B, C, H, D = o.shape
    both = jnp.concatenate([wo, jnp.swapaxes(w, 1, 2)[..., None]], axis=-1)  # [B, C, H, D + 1]
    both = lax.psum(both, axis_name)
    total = jnp.swapaxes(both[..., D], 1, 2)  # [B, H, C]
    seen = total > 0
    o = both[..., :D] / jnp.swapaxes(jnp.where(seen, total, 1.0), 1, 2)[..., None]
    lse = jnp.where(seen, m_safe + jnp.log(jnp.where(seen, total, 1.0)), -jnp.inf)
    return o, lse


def cache_attention(
    cache_k: jax.Array,
    cache_v: jax.Array,
    q: jax.Array,
    lengths: jax.Array,
    *,
    layout: str,
    mesh: Mesh | None,
    scale: float,
    window: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Attention of new queries q [B, C, H, D] to the cached positions ``< lengths`` [B].

    cache_k/v: one layer's [B, T, K, D] in layout order, sharded over "sp". Each device attends to
    its own shard; one pmax + one psum merge the partials. ``window``: query ``c`` (at position
    ``lengths + c``) sees only positions ``> lengths + c - window``. Returns (o f32 [B, C, H, D],
    lse f32 [B, H, C]), replicated over "sp".
    """
    n = axis_size(mesh, "sp")
    S = cache_k.shape[1] // n

    def local(k, v, q, lengths):  # k/v [b, S, k, D] this device's shard
        pos = layouts.shard_positions(layout, S, n, lax.axis_index("sp"))  # [S] global
        mask = pos[None, None, :] < lengths[:, None, None]  # [b, 1, S]
        mask = jnp.broadcast_to(mask, (q.shape[0], q.shape[1], S))
        if window is not None:
            q_pos = lengths[:, None] + jnp.arange(q.shape[1], dtype=jnp.int32)  # [b, C]
            mask = mask & (q_pos[:, :, None] - pos[None, None, :] < window)
        o, lse = dense_partial(q, k, v, mask, scale)
        return _allreduce_merge(o, lse, "sp")

    kv_spec, q_spec = P(BATCH, "sp", "tp", None), P(BATCH, None, "tp", None)
    return _run_sharded(
        local,
        mesh,
        (kv_spec, kv_spec, q_spec, P(BATCH)),
        (q_spec, P(BATCH, "tp", None)),
        cache_k,
        cache_v,
        q,
        lengths,
    )


def rotating_cache_attention(
    cache_k: jax.Array,
    cache_v: jax.Array,
    q: jax.Array,
    lengths: jax.Array,
    *,
    layout: str,
    mesh: Mesh | None,
    scale: float,
    implementation: str = "xla",
    block_sizes: BlockSizes | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Baseline with the results of :func:`cache_attention`: the cache shards travel around the
    ring (one ``ppermute`` of the whole shard per ring step, per layer, per token), each device
    attending its queries to the shard it holds with ring attention's per-step kernel."""
    n = axis_size(mesh, "sp")
    S = cache_k.shape[1] // n
    impl = implementations.resolve(implementation).load()
    perm = [(i, (i + 1) % n) for i in range(n)]

    def local(k, v, q, lengths):
        r = lax.axis_index("sp")
        b, c = q.shape[:2]
        q_seg = jnp.ones((b, c), jnp.int32)
        o = lse = None
        for t in range(n):
            nxt = (lax.ppermute(k, "sp", perm), lax.ppermute(v, "sp", perm)) if n > 1 else None
            pos = layouts.shard_positions(layout, S, n, (r - t) % n)  # [S] of the held shard
            k_seg = (pos[None, :] < lengths[:, None]).astype(jnp.int32)  # 1: filled, 0: not
            o_t, lse_t = impl.forward_step(
                q,
                k,
                v,
                jnp.zeros((c,), jnp.int32),
                pos,
                q_seg,
                k_seg,
                causal=False,
                softmax_scale=scale,
                block_sizes=block_sizes,
                interpret=False,
            )
            o, lse = (o_t, lse_t) if o is None else merge(o, lse, o_t, lse_t)
            if nxt is not None:
                k, v = nxt
        return o, lse

    kv_spec, q_spec = P(BATCH, "sp", "tp", None), P(BATCH, None, "tp", None)
    if mesh is None:
        return _run_sharded(local, None, None, None, cache_k, cache_v, q, lengths)
    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(kv_spec, kv_spec, q_spec, P(BATCH)),
        out_specs=(q_spec, P(BATCH, "tp", None)),
        check_vma=False,
    )(cache_k, cache_v, q, lengths)


def chunk_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, scale: float, window: int | None = None
) -> tuple[jax.Array, jax.Array]:
    """Causal attention of new queries q [B, C, H, D] to the new keys k/v [B, C, K, D] alone
    (within ``window`` positions when given)."""
    C = q.shape[1]
    i = jnp.arange(C)
    tri = i[None, :] <= i[:, None]  # [C, C]
    if window is not None:
        tri = tri & (i[:, None] - i[None, :] < window)
    return dense_partial(q, k, v, jnp.broadcast_to(tri, (q.shape[0], C, C)), scale)


def write(
    cache: KVCache,
    k_new: jax.Array,
    v_new: jax.Array,
    positions: jax.Array,
    valid: jax.Array,
    mesh: Mesh | None,
) -> KVCache:
    """Stores k/v_new [layers, B, C, K, D] at global ``positions`` [B, C] where ``valid`` [B, C].

    Only the device that owns a position writes it (positions >= T are dropped); ``lengths`` are
    left unchanged. In place when the cache is donated.
    """
    n, S = cache.ring, cache.shard_len
    layout, T = cache.layout, cache.max_len

    def local(k, v, kn, vn, pos, ok):  # k/v [L, b, S, k, D]; kn/vn [L, b, C, k, D]; pos/ok [b, C]
        owner, idx = slot(pos, layout, S, n)
        mine = ok & (owner == lax.axis_index("sp")) & (pos < T)
        idx = jnp.where(mine, idx, S)  # out of range: dropped
        rows = jnp.broadcast_to(jnp.arange(pos.shape[0])[:, None], pos.shape)
        k = k.at[:, rows, idx].set(kn.astype(k.dtype), mode="drop")
        v = v.at[:, rows, idx].set(vn.astype(v.dtype), mode="drop")
        return k, v

    new_spec, b_spec = P(None, BATCH, None, "tp", None), P(BATCH, None)
    k, v = _run_sharded(
        local,
        mesh,
        (CACHE_SPEC, CACHE_SPEC, new_spec, new_spec, b_spec, b_spec),
        (CACHE_SPEC, CACHE_SPEC),
        cache.k,
        cache.v,
        k_new,
        v_new,
        positions,
        valid,
    )
    return dataclasses.replace(cache, k=k, v=v)
