"""How global sequence positions are dealt to the devices of a ring.

Three layouts, all of which keep positions increasing within a shard:

* ``"contiguous"``: shard ``r`` holds positions ``[r*S, (r+1)*S)`` (Ring Attention, Liu et al. 2023).
* ``"striped"``: shard ``r`` holds positions ``r, r+N, r+2N, ...`` (Striped Attention, Brandon et al.
  2023), so every device does the same causal work in every ring step.
* ``"zigzag"``: the sequence is cut into ``2N`` chunks; shard ``r`` holds chunk ``r`` then chunk
  ``2N-1-r``, which balances causal work over the whole ring pass.

On a ring of one device every layout is the natural order, for any sequence length.

``to_layout`` / ``from_layout`` reorder a global array into the order in which the ring's shards are
concatenated (shard 0 first) and back; ``positions`` gives the global position of every element of that
order (what RoPE needs); ``shard_positions`` gives one shard's positions and accepts a traced ring index.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from einops import rearrange

LAYOUTS = ("contiguous", "striped", "zigzag")


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"{layout=} is not a known layout; choose one of {LAYOUTS}")


def parts(layout: str, ring_size: int) -> int:
    """The number of chunks a layout cuts a sequence into: ``seq_len`` must be a multiple of it.

    A ring of one holds the whole sequence in natural order under every layout, so it takes any
    length; otherwise zigzag needs ``2 * ring_size`` chunks and the others ``ring_size``.
    """
    check_layout(layout)
    if ring_size < 1:
        raise ValueError(f"{ring_size=} must be >= 1")
    return 2 * ring_size if layout == "zigzag" and ring_size > 1 else ring_size


def check_divisible(seq_len: int, layout: str, ring_size: int) -> None:
    """Raises ValueError unless a global ``seq_len`` can be dealt to ``ring_size`` shards."""
    n = parts(layout, ring_size)
    if seq_len % n:
        hint = (
            f"; layout='striped' (as balanced for causal attention) needs only a multiple of {ring_size}"
            if layout == "zigzag" and seq_len % ring_size == 0
            else ""
        )
        raise ValueError(f"{seq_len=} must be divisible by {n} for {layout=} with {ring_size=}{hint}")


def permutation(seq_len: int, layout: str, ring_size: int) -> np.ndarray:
    """Global positions in layout order: ``x_layout = x[..., permutation, ...]``. int32 [seq_len]."""
    check_divisible(seq_len, layout, ring_size)
    idx = np.arange(seq_len, dtype=np.int32)
    if layout == "contiguous" or ring_size == 1:
        return idx
    if layout == "striped":  # element i of shard r holds position i*N + r
        return rearrange(idx, "(i r) -> (r i)", r=ring_size)
    # zigzag: chunk r of the first half, then chunk N-1-r of the second half reversed (= 2N-1-r)
    halves = rearrange(idx, "(two r c) -> two r c", two=2, r=ring_size)
    return rearrange(np.stack([halves[0], halves[1, ::-1]]), "two r c -> (r two c)")


def positions(seq_len: int, layout: str, ring_size: int) -> np.ndarray:
    """Global position of every element of a sequence in layout order. int32 [seq_len]."""
    return permutation(seq_len, layout, ring_size)


def to_layout(x: jax.Array | np.ndarray, layout: str, ring_size: int, axis: int = 1) -> jax.Array:
    """Reorders a global array (natural order along ``axis``) into layout order."""
    perm = permutation(x.shape[axis], layout, ring_size)
    return jnp.take(x, jnp.asarray(perm), axis=axis)


def from_layout(x: jax.Array | np.ndarray, layout: str, ring_size: int, axis: int = 1) -> jax.Array:
    """Inverse of :func:`to_layout`."""
    perm = permutation(x.shape[axis], layout, ring_size)
    return jnp.take(x, jnp.asarray(np.argsort(perm)), axis=axis)


def shard_positions(layout: str, shard_len: int, ring_size: int, ring_index: int | jax.Array) -> jnp.ndarray:
    """Global positions of shard ``ring_index`` (may be traced). int32 [shard_len], increasing."""
    check_layout(layout)
    i = jnp.arange(shard_len, dtype=jnp.int32)
    r = jnp.asarray(ring_index, jnp.int32)
    if ring_size == 1:  # the whole sequence, in natural order, under every layout
        return i
    if layout == "contiguous":
        return r * shard_len + i
    if layout == "striped":
        return i * ring_size + r
    if shard_len % 2:
        raise ValueError(f"zigzag needs an even shard length, got {shard_len=}")
    half = shard_len // 2
    first = r * half + i
    second = (2 * ring_size - 1 - r) * half + (i - half)
    return jnp.where(i < half, first, second)


def causal_work(layout: str, ring_size: int, shard_len: int, block: int) -> np.ndarray:
    """Causal (query block, key block) pairs each device computes at each ring step.

    Returns int [ring_size (device), ring_size (step)]: the number of block pairs that are not
    completely hidden by the causal mask when device ``r`` holds the key shard of device ``r - t``.
    Balanced layouts give every device the same row sums (zigzag) or the same count at every step
    (striped).
    """
    if shard_len % block:
        raise ValueError(f"{shard_len=} must be a multiple of {block=}")
    nb = shard_len // block
    out = np.zeros((ring_size, ring_size), np.int64)
    for r in range(ring_size):
        qp = np.asarray(shard_positions(layout, shard_len, ring_size, r)).reshape(nb, block)
        for t in range(ring_size):
            kp = np.asarray(shard_positions(layout, shard_len, ring_size, (r - t) % ring_size))
            kp = kp.reshape(nb, block)
            out[r, t] = int((kp.min(1)[None, :] <= qp.max(1)[:, None]).sum())
    return out


def _runs(layout: str, ring_size: int, shard_len: int) -> tuple[np.ndarray, int, int]:
    """Every shard's positions as runs of an arithmetic progression: (first positions int64
    [ring, runs], stride, run length). Zigzag: two runs of consecutive positions; striped: one of
    stride N; contiguous (and a ring of one): one of stride 1."""
    r = np.arange(ring_size, dtype=np.int64)[:, None]
    if layout == "contiguous" or ring_size == 1:
        return r * shard_len, 1, shard_len
    if layout == "striped":
        return r, ring_size, shard_len
    half = shard_len // 2
    return np.concatenate([r * half, (2 * ring_size - 1 - r) * half], axis=1), 1, half


def _pairs_in_band(c: np.ndarray, stride: int, m: int, lo: int, hi: int) -> np.ndarray:
    """#{(a, b) in [0, m)^2 : lo <= c + stride (a - b) < hi}, elementwise over int64 ``c``.

    d = a - b occurs m - |d| times; the band holds d in [first, last], and the pairs of
    d <= k sum to (m + k)(m + k + 1) / 2 for -m <= k <= 0, m(m + 1)/2 + k m - k(k + 1)/2 above."""
    first = np.maximum(-((c - lo) // stride), -(m - 1))  # ceil((lo - c) / stride)
    last = np.minimum(-((c - hi) // stride) - 1, m - 1)  # ceil((hi - c) / stride) - 1

    def upto(k):
        below = (m + k) * (m + k + 1) // 2
        return np.where(k <= 0, below, m * (m + 1) // 2 + k * m - k * (k + 1) // 2)

    return np.where(last >= first, upto(last) - upto(first - 1), 0)


def visible_pairs(
    layout: str, ring_size: int, shard_len: int, causal: bool, window: int | None = None
) -> np.ndarray:
    """(query, key) pairs the mask lets through when device ``r`` holds the key shard of device
    ``r - t``: int64 [ring_size (device), ring_size (step)], in closed form (no [S, S] mask).

    ``causal``: key position <= query position; ``window`` W: ``|i - j| < W`` too (segment ids are
    data and not counted). The attention work of a ring step, pair by pair (``causal_work`` counts
    block pairs); the sum over steps is the same in every layout.
    """
    check_layout(layout)
    starts, stride, m = _runs(layout, ring_size, shard_len)
    big = ring_size * shard_len + 1  # beyond any difference of two positions
    lo = 0 if causal else (-big if window is None else 1 - window)
    hi = big if window is None else int(window)
    c = starts[:, None, :, None] - starts[None, :, None, :]  # [query shard, key shard, run, run]
    pairs = _pairs_in_band(c, stride, m, lo, hi).sum((2, 3))  # [query shard r, key shard s]
    r = np.arange(ring_size)
    return pairs[r[:, None], (r[:, None] - r[None, :]) % ring_size]  # [r, t]: key shard r - t
