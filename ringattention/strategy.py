"""Which context-parallel strategy to run: ring, all-gather or Ulysses, from a cost model.

Three exact ways to attend over a sequence split into N shards of S tokens (``ring_attention``'s
``strategy``):

* ``"ring"``: k/v shards travel around the ring, one hop per step, each hidden behind the step's
  attention (Ring Attention, Liu et al. 2023). k/v memory O(S) per device.
* ``"all_gather"``: every device all-gathers k/v and attends its queries to the whole sequence
  (Llama 3 context parallelism, Dubey et al. 2024, §3.3.2; MaxText's default): the same bytes, in
  one collective that need not hide behind one step, but k/v for the whole sequence (in pieces) per
  device (``ringattention.all_gather``).
* ``"ulysses"``: one all-to-all trades the sequence for heads, every device attends over the whole
  sequence with H / N heads, a second returns the output (DeepSpeed-Ulysses, Jacobs et al. 2023;
  ``ringattention.ulysses``). Needs ``heads % N == 0``; kv heads are repeated to K' as
  ``ulysses.kv_repeats`` says. USP (Fang & Zhao 2024) combines it with the ring (``ulysses_axis``).

Bytes sent per device for one layer (elements times the dtype size b; dk/dv travel in float32; E =
D + Dv, the head dims of one k and one v row), as ``ulysses.py``'s docstring derives and
``benchmarks/cp_bytes.py`` and ``tests/test_strategy.py`` check against the HLO of one layer
compiled forward + backward, where XLA merges the backward's all-gathers, and those of its k/v hops
that sit outside a loop, with the forward's (a scanned layer stack sends them again):

====================  =====================================  =========================================
strategy              forward                                backward (after the forward)
====================  =====================================  =========================================
ring                  h S K E b                              a S K E b + (h + d) S K E 4
all_gather            (N - 1) S K E b                        (N - 1) S K E 4
ulysses               (N - 1) / N S (H + K') E b             the same (do in; dq, dk, dv out)
====================  =====================================  =========================================

h: the hops of the ring's lap in d directions, N - 1 in one for a full lap. a: the k/v hops the
backward sends again, m - 1 for each direction of m > 2 hops (a full lap: N - 2); a direction's
first hop is the forward's, and so is its second where m = 2 (XLA unrolls the one-iteration loop).
dk/dv take m + 1 hops per direction (m - 1 in the loop, the last one, the way home). A sliding
window W shortens the lap where the layout lets it (``lap_plan.lap_plan``: only the offsets whose
shards some query can see, f hops forward and b backward, h = f + b): fewer bytes and fewer steps.
Striped shards hold positions from the whole sequence, so their lap stays full and only the steps'
compute shrinks. The all-gather still gathers every shard (it skips the compute of pieces wholly
outside the window); the Ulysses all-to-alls are unchanged and its one whole-sequence step computes
the window's pairs only.

Compute: 2 E flops per head per visible (query, key) pair, forward (``q.k`` and ``p.v``), pairs
counted exactly per device and step (``layouts.visible_pairs``). A ring step lasts as long as its
slowest device; the ring hides its hops if every visited step after the first computes at least as
long as one hop takes (:func:`step_times`: the weakest step).

Memory of one layer's attention per device, forward and backward (:func:`memory_bytes`): its
residuals (q, k, v, o in the dtype, lse in float32) and float32 dq, dk, dv, for S tokens of every
head (Ulysses: the whole sequence of H / N heads and K' / N kv heads, the same count with K'), plus
the ring's k/v held and in flight and the dk/dv travelling with them (``2 S K E (b + 4)``), or the
all-gather's two gathered pieces and the float32 dk/dv of one (``2 L / c K E b + L / c K E 4``, c =
``gather_chunks``). The budget: ``MEMORY_BUDGET_FRACTION`` of device memory.

The choice (:func:`choose`), among the strategies whose heads divide and that fit the budget: one
device: the ring (nothing moves). Else Ulysses where it sends fewer bytes than the ring; else the
all-gather where a ring step's transfer cannot hide behind its compute (short shards) and the
window leaves the ring's lap full; else the ring. If the ring does not fit, the fitting strategy
that sends the fewest bytes; if none fits, the one that needs the least memory (the reason says
so: "auto" never fails for memory, the budget being a judgement). Per-platform constants below are
deliberately round; each names its source.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ringattention import layouts, ulysses
from ringattention.lap_plan import window_plan

STRATEGIES = ("ring", "all_gather", "ulysses")
CHOICES = (*STRATEGIES, "auto")
ACC_BYTES = 4  # dq/dk/dv accumulators are float32
LSE_BYTES = 4  # the log-sum-exp residual is float32
GIB = 2**30

# ---- per-platform constants -------------------------------------------------------------------
# Link: one direction of the link between ring neighbours, bytes/s. Attention: FLOP/s an attention
# kernel reaches in bfloat16 (not the peak). Memory: device memory, bytes.
H100_LINK = 450e9  # NVLink 4: 900 GB/s bidirectional per H100/H200 SXM (NVIDIA H100 datasheet)
H100_ATTENTION = 600e12  # FlashAttention-3 bf16 forward: 600-740 TFLOP/s on H100 (Shah et al. 2024)
H100_MEMORY = 80 * GIB  # H100 SXM HBM3
H200_MEMORY = 141e9  # H200 HBM3e (NVIDIA H200 datasheet); same GH100 die and NVLink as the H100
TPU_V5P_LINK = 100e9  # 4,800 Gbps ICI per v5p chip over the 6 links of a 3-D torus (Cloud TPU docs)
TPU_V5P_ATTENTION = 275e12  # 60% of v5p's 459 TFLOP/s bf16 peak (Cloud TPU docs; splash attention)
TPU_V5P_MEMORY = 95 * GIB  # v5p HBM2e (Cloud TPU docs)
TPU_V5E_LINK = 50e9  # 1,600 Gbps ICI per v5e chip over the 4 links of a 2-D torus (Cloud TPU docs)
TPU_V5E_ATTENTION = 118e12  # 60% of v5e's 197 TFLOP/s bf16 peak (Cloud TPU docs)
TPU_V5E_MEMORY = 16 * GIB  # v5e HBM2 (Cloud TPU docs)
CPU_LINK = 10e9  # virtual CPU devices copy through host memory: ~10 GB/s for one core's memcpy
CPU_ATTENTION = 50e9  # a few cores' float32 FMAs (the CPU is for tests, not speed)
CPU_MEMORY = 16 * GIB  # a test machine
# One layer's attention (module docstring, "Memory") may fill this fraction of device memory:
# weights, optimizer state, the other layers' residuals and the rest of the layer need the rest (a
# judgement, not a measurement).
MEMORY_BUDGET_FRACTION = 0.25


@dataclasses.dataclass(frozen=True)
class Platform:
    name: str
    link_bytes_per_s: float
    attention_flops_per_s: float
    memory_bytes: float


PLATFORMS = {
    "h100": Platform("h100", H100_LINK, H100_ATTENTION, H100_MEMORY),
    "h200": Platform("h200", H100_LINK, H100_ATTENTION, H200_MEMORY),
    "tpu_v5p": Platform("tpu_v5p", TPU_V5P_LINK, TPU_V5P_ATTENTION, TPU_V5P_MEMORY),
    "tpu_v5e": Platform("tpu_v5e", TPU_V5E_LINK, TPU_V5E_ATTENTION, TPU_V5E_MEMORY),
    "cpu": Platform("cpu", CPU_LINK, CPU_ATTENTION, CPU_MEMORY),
}


def platform_of(device: Any) -> Platform:
    """The constants for a jax device (its ``platform`` and ``device_kind``); other GPUs: H100's."""
    kind = str(getattr(device, "device_kind", "")).lower()
    if getattr(device, "platform", "cpu") == "cpu":
        return PLATFORMS["cpu"]
    if "tpu" in kind:
        return PLATFORMS["tpu_v5e" if ("lite" in kind or "v5e" in kind) else "tpu_v5p"]
    return PLATFORMS["h200" if "h200" in kind else "h100"]


@dataclasses.dataclass(frozen=True)
class Shape:
    """One layer's attention: global sequence ``seq`` over ``devices`` shards in ``layout`` order,
    causal or not, within a sliding ``window`` (None: none); ``v_head_dim`` None: ``head_dim``."""

    batch: int
    seq: int
    heads: int
    kv_heads: int
    head_dim: int
    devices: int
    dtype_bytes: int = 2
    causal: bool = True
    gather_chunks: int = 2
    layout: str = "zigzag"
    window: int | None = None
    v_head_dim: int | None = None

    @property
    def shard(self) -> int:
        return self.seq // self.devices

    @property
    def kv_dims(self) -> int:
        """E: the head dims of one k row and one v row together (D + Dv)."""
        return self.head_dim + (self.v_head_dim or self.head_dim)


def _kv_heads_exchanged(s: Shape) -> int:
    """K': kv heads after the repeats that give every Ulysses rank whole kv heads."""
    return s.kv_heads * (s.devices // math.gcd(s.kv_heads, s.devices))


def _check(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not one of {STRATEGIES}")


def lap(s: Shape) -> tuple[int, int]:
    """(forward, backward) hops of the ring's lap: (N - 1, 0) for a full lap, fewer where a sliding
    window lets the layout skip shards (``lap_plan.window_plan``: the plan the ring runs)."""
    if s.devices == 1:
        return 0, 0
    _, hops = window_plan(s.window, s.layout, s.devices, s.shard, s.causal)
    return hops if hops is not None else (s.devices - 1, 0)


def ring_steps(s: Shape) -> list[int]:
    """The ring offsets the lap visits, in order: 0 (the own shard), 1..f, then N-1..N-b."""
    f, b = lap(s)
    return [0, *range(1, f + 1), *(s.devices - j for j in range(1, b + 1))]


def _shard_kv(s: Shape) -> int:
    return s.batch * s.shard * s.kv_heads * s.kv_dims  # elements of one k, v shard


def bytes_sent(s: Shape, strategy: str) -> tuple[float, float]:
    """(forward, forward + backward) bytes one device sends for one layer (module docstring)."""
    _check(strategy)
    n, b, kv = s.devices, s.dtype_bytes, _shard_kv(s)
    if n == 1:
        return 0.0, 0.0
    if strategy == "ring":
        dirs = [m for m in lap(s) if m]  # hops of each direction's half-lap
        fwd = sum(dirs) * kv * b
        again = sum(m - 1 for m in dirs if m > 2)  # k/v hops the backward sends again (docstring)
        dkdv = sum(m + 1 for m in dirs)  # float32 dk/dv: m - 1 in the loop, the last, the way home
        return float(fwd), float(fwd + again * kv * b + dkdv * kv * ACC_BYTES)
    if strategy == "all_gather":
        fwd = (n - 1) * kv * b
        return float(fwd), float(fwd + (n - 1) * kv * ACC_BYTES)
    fwd = (n - 1) / n * s.batch * s.shard * (s.heads + _kv_heads_exchanged(s)) * s.kv_dims * b
    return fwd, 2 * fwd


def kv_bytes(s: Shape, strategy: str) -> float:
    """Bytes of k and v one device holds for attention at once (forward)."""
    _check(strategy)
    per_token = s.batch * s.kv_heads * s.kv_dims * s.dtype_bytes
    if strategy == "ring":  # the held shard and the next one in flight
        return 2 * s.shard * per_token
    if strategy == "all_gather":  # its own shard and two gathered pieces (one: the whole sequence)
        c = s.gather_chunks
        return (s.shard + min(c, 2) * s.seq / c) * per_token
    # the whole sequence for K' / N kv heads
    return s.seq * per_token * _kv_heads_exchanged(s) / s.kv_heads / s.devices


def memory_bytes(s: Shape, strategy: str) -> float:
    """Bytes one device holds for one layer's attention, forward and backward (module docstring,
    "Memory"): residuals and float32 gradients of its tokens and heads, plus the ring's buffers in
    flight or the all-gather's gathered pieces."""
    _check(strategy)
    b, e, dv = s.dtype_bytes, s.kv_dims, s.kv_dims - s.head_dim
    kv_heads = _kv_heads_exchanged(s) if strategy == "ulysses" else s.kv_heads
    tokens = s.batch * s.shard  # Ulysses: the whole sequence for H / N heads, the same count
    q_side = tokens * s.heads * ((s.head_dim + dv) * b + LSE_BYTES + s.head_dim * ACC_BYTES)
    kv_side = tokens * kv_heads * e * (b + ACC_BYTES)  # k, v and float32 dk, dv
    extra = 0.0
    if strategy == "ring" and s.devices > 1:  # k/v held and in flight, dk/dv travelling with them
        extra = 2 * tokens * s.kv_heads * e * (b + ACC_BYTES)
    elif strategy == "all_gather" and s.devices > 1:  # two gathered pieces, float32 dk/dv of one
        piece = s.batch * s.seq / s.gather_chunks * s.kv_heads * e
        extra = min(s.gather_chunks, 2) * piece * b + piece * ACC_BYTES
    return float(q_side + kv_side + extra)


def step_pairs(s: Shape) -> np.ndarray:
    """Visible (query, key) pairs per device and ring step: int64 [N (device), N (step)]."""
    return layouts.visible_pairs(s.layout, s.devices, s.shard, s.causal, s.window)


def _flops_per_pair(s: Shape, heads: float) -> float:
    return 2.0 * s.batch * heads * s.kv_dims  # q.k (2 D) and p.v (2 Dv) per head, forward


def compute_seconds(s: Shape, p: Platform, strategy: str) -> float:
    """Forward attention seconds of the slowest device: the ring's visited steps, each as long as
    its slowest device; the all-gather's every visible pair of a device; Ulysses' whole-sequence
    pairs for H / N heads."""
    _check(strategy)
    if strategy == "ulysses":
        whole = layouts.visible_pairs("contiguous", 1, s.seq, s.causal, s.window)[0, 0]
        work = float(whole) * _flops_per_pair(s, s.heads / s.devices)
    elif strategy == "ring":
        work = float(step_pairs(s)[:, ring_steps(s)].max(0).sum()) * _flops_per_pair(s, s.heads)
    else:
        work = float(step_pairs(s).sum(1).max()) * _flops_per_pair(s, s.heads)
    return work / p.attention_flops_per_s


def step_times(s: Shape, p: Platform) -> tuple[float, float]:
    """(compute, transfer) seconds of the weakest forward ring step: the least compute of a visited
    step after the first (its slowest device's pairs) against one k, v hop (one device: its step)."""
    steps = ring_steps(s)[1:] or [0]
    pairs = float(step_pairs(s)[:, steps].max(0).min())
    hop = _shard_kv(s) * s.dtype_bytes if s.devices > 1 else 0
    return (pairs * _flops_per_pair(s, s.heads) / p.attention_flops_per_s, hop / p.link_bytes_per_s)


def budget_bytes(p: Platform, memory_budget: float | None = None) -> float:
    """The memory one layer's attention may use: ``memory_budget``, else the platform's share."""
    return MEMORY_BUDGET_FRACTION * p.memory_bytes if memory_budget is None else memory_budget


def table(s: Shape, p: Platform, memory_budget: float | None = None) -> list[dict]:
    """One row per strategy: whether it runs (heads) and fits (memory), why not, bytes, memory,
    compute, the ring's step times and lap."""
    budget = budget_bytes(p, memory_budget)
    compute, transfer = step_times(s, p)
    rows = []
    for name in STRATEGIES:
        mem = memory_bytes(s, name)
        runs = not (name == "ulysses" and s.heads % s.devices)
        why = None if runs else f"heads={s.heads} not divisible by {s.devices} devices"
        if runs and mem > budget:
            why = f"{name} needs {mem / GIB:,.2f} GiB > budget {budget / GIB:,.2f} GiB"
        fwd, fwd_bwd = bytes_sent(s, name)
        rows.append(
            {
                "strategy": name,
                "runs": runs,
                "fits": mem <= budget,
                "feasible": why is None,
                "why_not": why,
                "bytes_fwd": fwd,
                "bytes_fwd_bwd": fwd_bwd,
                "kv_bytes": kv_bytes(s, name),
                "memory_bytes": mem,
                "compute_s": compute_seconds(s, p, name),
                "step_compute_s": compute,
                "step_transfer_s": transfer,
                "ring_hops": lap(s),
                "ring_hides_transfer": compute >= transfer,
            }
        )
    return rows


@dataclasses.dataclass(frozen=True)
class Decision:
    strategy: str
    reason: str
    rows: tuple  # table() rows


def _gib(row: dict) -> str:
    return f"{row['memory_bytes'] / GIB:,.2f} GiB"


def _mib(row: dict) -> str:
    return f"{row['bytes_fwd_bwd'] / 2**20:,.1f} MiB"


def choose(
    s: Shape, p: Platform, memory_budget: float | None = None, allowed: tuple[str, ...] = STRATEGIES
) -> Decision:
    """The strategy the cost model picks (module docstring), the reason and the numbers."""
    rows = tuple(table(s, p, memory_budget))
    by = {r["strategy"]: r for r in rows}
    ring, ag, budget = by["ring"], by["all_gather"], budget_bytes(p, memory_budget) / GIB
    if s.devices == 1:
        over = "" if ring["fits"] else f"; it needs {_gib(ring)} > budget {budget:,.2f} GiB"
        return Decision("ring", "one device: nothing moves" + over, rows)
    runs = [n for n in allowed if by[n]["runs"]]
    ok = [n for n in runs if by[n]["fits"]]
    if not ok:
        pick = min(runs, key=lambda n: by[n]["memory_bytes"])
        sizes = ", ".join(f"{n} {_gib(by[n])}" for n in runs)
        return Decision(pick, f"none fits the budget {budget:,.2f} GiB ({sizes}): the least memory", rows)
    if "ring" not in ok:
        pick = min(ok, key=lambda n: by[n]["bytes_fwd_bwd"])
        why = ring["why_not"] or "ring not allowed"
        return Decision(pick, f"{why}; it fits and sends {_mib(by[pick])}", rows)
    uly = by["ulysses"]
    if "ulysses" in ok and uly["bytes_fwd_bwd"] < ring["bytes_fwd_bwd"]:
        return Decision("ulysses", f"heads allow it and it sends {_mib(uly)} < the ring's {_mib(ring)}", rows)
    hides, full_lap = ring["ring_hides_transfer"], ag["bytes_fwd"] <= ring["bytes_fwd"]
    if "all_gather" in ok and not hides and full_lap:
        return Decision(
            "all_gather",
            f"a ring step's transfer {ring['step_transfer_s'] * 1e6:,.1f}"
            f" us exceeds its compute {ring['step_compute_s'] * 1e6:,.1f} us and the "
            f"all-gather fits ({_gib(ag)})",
            rows,
        )
    if hides:
        why = "the ring hides each hop behind its step"
    elif not full_lap:
        why = f"the window's lap sends {sum(lap(s))} of the {s.devices - 1} shards a gather would"
    else:
        why = ag["why_not"] or "all_gather not allowed"
    return Decision("ring", why, rows)


def check(strategy: str) -> str:
    """``strategy`` if it is one of :data:`CHOICES`; ValueError listing them otherwise."""
    if strategy not in CHOICES:
        raise ValueError(f"strategy={strategy!r} is not known; choose one of {CHOICES}")
    return strategy


def resolve(
    strategy: str,
    q_shape: tuple[int, ...],
    k_shape: tuple[int, ...],
    dtype_bytes: int,
    axis_name: str | tuple[str, ...],
    ring_size: int,
    ulysses_size: int | None,
    causal: bool,
    device: Any = None,
    *,
    layout: str = "contiguous",
    window: int | None = None,
    v_head_dim: int | None = None,
) -> str:
    """The strategy ``ring_attention`` runs: ``strategy`` checked, "auto" decided by :func:`choose`
    on this call's shapes, ``layout``, sliding ``window`` and v head dim, on the platform of
    ``device`` (the mesh's). ``causal``: the mask the lap is planned for (a prefix or bidirectional
    segments count as not causal). ``ulysses_size``: U of a ``ulysses_axis`` (None: none); the
    choice is then between "ring" and "all_gather" on what the ring axis sees (U pieces per shard,
    H / U heads). ValueError for an unknown strategy, and for "ulysses" where the heads do not
    divide by the axis size."""
    check(strategy)
    B, S, H, D = q_shape
    K = k_shape[2]
    if strategy == "ulysses":
        if ulysses_size is not None:
            raise ValueError(
                "strategy='ulysses' exchanges heads over axis_name itself; with "
                "ulysses_axis set use strategy='ring' or 'all_gather' (Ulysses x ring)"
            )
        if H % ring_size:
            raise ValueError(
                f"strategy='ulysses' needs the query heads divisible by the size of "
                f"axis_name={axis_name!r}; got heads={H}, axis size {ring_size}"
            )
    if strategy != "auto":
        return strategy
    allowed = STRATEGIES
    if ulysses_size is not None:  # the ring's view after the Ulysses exchange
        u = ulysses_size
        K = K * (ulysses.kv_repeats(H, K, u) if u > 1 else 1) // u
        S, H, allowed = S * u, H // u, ("ring", "all_gather")
    shape = Shape(
        B,
        S * ring_size,
        H,
        K,
        D,
        ring_size,
        dtype_bytes,
        causal,
        layout=layout,
        window=window,
        v_head_dim=v_head_dim,
    )
    return choose(shape, platform_of(device), allowed=allowed).strategy


def gather_chunks(
    requested: int | None, shard: int, takes_shard: Callable[[int], bool] = lambda n: True
) -> int:
    """Pieces of the shard the all-gather sends one by one. None: 2 where the shard halves (and the
    kernel takes the half), else 1. ValueError unless a positive int dividing the shard."""
    if requested is None:
        return 2 if shard % 2 == 0 and takes_shard(shard // 2) else 1
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1 or shard % requested:
        raise ValueError(
            f"gather_chunks={requested!r} must be a positive int dividing the shard length {shard}"
        )
    return requested
