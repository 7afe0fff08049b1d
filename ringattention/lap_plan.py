"""Which ring offsets a lap visits under a sliding window (Mistral, Jiang et al. 2023), at trace time.

Ring Attention (Liu, Zaharia & Abbeel 2023) passes every key/value shard once around the ring. With
a window ``|i - j| < W`` a query shard sees only the shards whose positions come within W of its
own, so the lap can stop short: :func:`lap_plan` finds the offsets some query can see from the
positions of every shard (any layout, numpy, static) and covers them with the cheapest pair of
half-laps, ``f`` hops forward and ``b`` backward. ``ring.py`` runs the plan; ``strategy.py``'s cost
model counts the same hops.
"""

from __future__ import annotations

import numpy as np

from ringattention import layouts


def runs(layout: str) -> int:
    """Runs of consecutive global positions per shard (zigzag: two chunks)."""
    return 2 if layout == "zigzag" else 1


def lap_plan(positions: np.ndarray, runs: int, causal: bool, window: int | None) -> tuple[int, int] | None:
    """(forward, backward) ring hops that reach every shard some query can see; None: a full lap.

    Static (numpy, at trace time). ``positions``: int [n, S], the global positions of every ring
    shard, each made of ``runs`` runs of consecutive positions. Offset t is needed if for some device
    r a run of its positions and a run of shard r - t's have differences inside the window (segment
    ids are ignored: they are data). The hops are the cheapest cover of the needed offsets by
    [0, f] and [-b, -1].
    """
    n = positions.shape[0]
    if window is None or n < 3:
        return None
    pos = np.asarray(positions, np.int64).reshape(n, runs, -1)
    lo, hi = pos.min(-1), pos.max(-1)  # [n, runs]
    near = lo[:, None, :, None] - hi[None, :, None, :]  # [query shard, key shard, run, run]
    far = hi[:, None, :, None] - lo[None, :, None, :]
    vis = (near < window) & (far > -window) & ((far >= 0) if causal else True)
    vis = vis.any((2, 3))  # [query shard r, key shard]
    needed = [t for t in range(n) if any(vis[r, (r - t) % n] for r in range(n))]
    cost, fwd = min((f + max([n - t for t in needed if t > f], default=0), -f) for f in range(n))
    if cost >= n - 1:
        return None
    return -fwd, cost + fwd


def window_plan(
    sliding_window: int | None, layout: str, n: int, shard: int, causal: bool
) -> tuple[int | None, tuple[int, int] | None]:
    """(window, hops) of ``ring._Config``: None for a window that hides nothing (>= the sequence)."""
    if sliding_window is None or sliding_window >= n * shard:
        return None, None
    positions = layouts.permutation(n * shard, layout, n).reshape(n, shard)  # of every ring shard
    return int(sliding_window), lap_plan(positions, runs(layout), causal, int(sliding_window))
