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

Bytes sent per device for one layer (elements times the dtype size b; dk/dv travel in float32),
as ``ulysses.py``'s docstring derives and ``benchmarks/cp_bytes.py`` checks against the HLO of one
layer compiled forward + backward, where XLA merges the backward's first ring hop, and the
backward's all-gathers, with the forward's (a scanned layer stack sends them again: ring
``+ 2 S K D b``, all_gather ``+ (N - 1) 2 S K D b``):

====================  =====================================  =========================================
strategy              forward                                backward (after the forward)
====================  =====================================  =========================================
ring                  (N - 1) 2 S K D b                      (N - 2) 2 S K D b + N 2 S K D 4
all_gather            (N - 1) 2 S K D b                      (N - 1) 2 S K D 4
ulysses               (N - 1) / N S D (2 H + 2 K') b         the same (do in; dq, dk, dv out)
====================  =====================================  =========================================

The choice (:func:`choose`): Ulysses where the heads allow and it sends fewer bytes; else the
all-gather where the ring's per-step transfer cannot hide behind its per-step compute (short shards)
and the gathered k/v fit the memory budget; else the ring. Per-platform constants below are
deliberately round; each names its source.
"""

from __future__ import annotations

import dataclasses
import math

from ringattention import ulysses

STRATEGIES = ("ring", "all_gather", "ulysses")
CHOICES = (*STRATEGIES, "auto")
ACC_BYTES = 4  # dk/dv accumulators are float32
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
# The all-gather may fill this fraction of device memory with gathered k/v: weights, optimizer state
# and the other activations of the layer need the rest (a judgement, not a measurement).
KV_BUDGET_FRACTION = 0.25
CAUSAL_WORK = 0.5  # a causal step computes half the score blocks on average (balanced layouts)


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


def platform_of(device) -> Platform:
    """The constants for a jax device (its ``platform`` and ``device_kind``); other GPUs: H100's."""
    kind = str(getattr(device, "device_kind", "")).lower()
    if getattr(device, "platform", "cpu") == "cpu":
        return PLATFORMS["cpu"]
    if "tpu" in kind:
        return PLATFORMS["tpu_v5e" if ("lite" in kind or "v5e" in kind) else "tpu_v5p"]
    return PLATFORMS["h200" if "h200" in kind else "h100"]


@dataclasses.dataclass(frozen=True)
class Shape:
    """One layer's attention: global sequence ``seq`` over ``devices`` shards."""

    batch: int
    seq: int
    heads: int
    kv_heads: int
    head_dim: int
    devices: int
    dtype_bytes: int = 2
    causal: bool = True
    gather_chunks: int = 2

    @property
    def shard(self) -> int:
        return self.seq // self.devices


def _kv_heads_exchanged(s: Shape) -> int:
    """K': kv heads after the repeats that give every Ulysses rank whole kv heads."""
    return s.kv_heads * (s.devices // math.gcd(s.kv_heads, s.devices))


def bytes_sent(s: Shape, strategy: str) -> tuple[float, float]:
    """(forward, forward + backward) bytes one device sends for one layer (module docstring)."""
    n, b = s.devices, s.dtype_bytes
    shard_kv = s.batch * s.shard * 2 * s.kv_heads * s.head_dim  # elements of one k, v shard
    if n == 1:
        return 0.0, 0.0
    if strategy == "ring":
        fwd = (n - 1) * shard_kv * b
        return fwd, fwd + (n - 2) * shard_kv * b + n * shard_kv * ACC_BYTES
    if strategy == "all_gather":
        fwd = (n - 1) * shard_kv * b
        return fwd, fwd + (n - 1) * shard_kv * ACC_BYTES
    if strategy == "ulysses":
        fwd = (n - 1) / n * s.batch * s.shard * s.head_dim * (2 * s.heads
                                                              + 2 * _kv_heads_exchanged(s)) * b
        return fwd, 2 * fwd
    raise ValueError(f"strategy={strategy!r} is not one of {STRATEGIES}")


def kv_bytes(s: Shape, strategy: str) -> float:
    """Bytes of k and v one device holds for attention at once (forward)."""
    per_token = s.batch * 2 * s.kv_heads * s.head_dim * s.dtype_bytes
    if strategy == "ring":  # the held shard and the next one in flight
        return 2 * s.shard * per_token
    if strategy == "all_gather":  # its own shard and two gathered pieces (one: the whole sequence)
        c = s.gather_chunks
        return (s.shard + min(c, 2) * s.seq / c) * per_token
    if strategy == "ulysses":  # the whole sequence for K' / N kv heads
        return s.seq * per_token * _kv_heads_exchanged(s) / s.kv_heads / s.devices
    raise ValueError(f"strategy={strategy!r} is not one of {STRATEGIES}")


def step_times(s: Shape, p: Platform) -> tuple[float, float]:
    """(compute, transfer) seconds of one forward ring step: S x S attention vs one k, v hop."""
    work = CAUSAL_WORK if s.causal else 1.0
    flops = 4 * s.batch * s.shard * s.shard * s.heads * s.head_dim * work
    hop = s.batch * s.shard * 2 * s.kv_heads * s.head_dim * s.dtype_bytes
    return flops / p.attention_flops_per_s, hop / p.link_bytes_per_s


def table(s: Shape, p: Platform, memory_budget: float | None = None) -> list[dict]:
    """One row per strategy: whether it runs here (and why not), bytes, k/v memory, step times."""
    budget = KV_BUDGET_FRACTION * p.memory_bytes if memory_budget is None else memory_budget
    compute, transfer = step_times(s, p)
    rows = []
    for name in STRATEGIES:
        why = None
        if name == "ulysses" and s.heads % s.devices:
            why = f"heads={s.heads} not divisible by {s.devices} devices"
        if name == "all_gather" and kv_bytes(s, name) > budget:
            why = f"gathered k/v {kv_bytes(s, name) / GIB:.1f} GiB > budget {budget / GIB:.1f} GiB"
        fwd, fwd_bwd = bytes_sent(s, name)
        rows.append({"strategy": name, "feasible": why is None, "why_not": why, "bytes_fwd": fwd,
                     "bytes_fwd_bwd": fwd_bwd, "kv_bytes": kv_bytes(s, name),
                     "step_compute_s": compute, "step_transfer_s": transfer,
                     "ring_hides_transfer": compute >= transfer})
    return rows


@dataclasses.dataclass(frozen=True)
class Decision:
    strategy: str
    reason: str
    rows: tuple  # table() rows


def choose(s: Shape, p: Platform, memory_budget: float | None = None,
           allowed: tuple[str, ...] = STRATEGIES) -> Decision:
    """The strategy the cost model picks (module docstring), the reason and the numbers."""
    rows = table(s, p, memory_budget)
    by = {r["strategy"]: r for r in rows}
    ring = by["ring"]
    if s.devices == 1:
        return Decision("ring", "one device: nothing moves", tuple(rows))
    uly = by["ulysses"]
    if "ulysses" in allowed and uly["feasible"] and uly["bytes_fwd_bwd"] < ring["bytes_fwd_bwd"]:
        return Decision("ulysses", f"heads allow it and it sends {uly['bytes_fwd_bwd'] / 2**20:,.1f}"
                        f" MiB < the ring's {ring['bytes_fwd_bwd'] / 2**20:,.1f} MiB", tuple(rows))
    ag = by["all_gather"]
    if "all_gather" in allowed and ag["feasible"] and not ring["ring_hides_transfer"]:
        return Decision("all_gather", f"a ring step's transfer {ring['step_transfer_s'] * 1e6:.1f} "
                        f"us exceeds its compute {ring['step_compute_s'] * 1e6:.1f} us and the "
                        f"gathered k/v fit ({ag['kv_bytes'] / GIB:.2f} GiB)", tuple(rows))
    why = ("the ring hides each hop behind its step" if ring["ring_hides_transfer"]
           else ag["why_not"] or "all_gather not allowed")
    return Decision("ring", why, tuple(rows))


def check(strategy) -> str:
    """``strategy`` if it is one of :data:`CHOICES`; ValueError listing them otherwise."""
    if strategy not in CHOICES:
        raise ValueError(f"strategy={strategy!r} is not known; choose one of {CHOICES}")
    return strategy


def resolve(strategy, q_shape, k_shape, dtype_bytes: int, axis_name, ring_size: int,
            ulysses_size: int | None, causal: bool, device=None) -> str:
    """The strategy ``ring_attention`` runs: ``strategy`` checked, "auto" decided by :func:`choose`
    on this call's shapes and the platform of ``device`` (the mesh's). ``ulysses_size``: U of a
    ``ulysses_axis`` (None: none); the choice is then between "ring" and "all_gather" on what the
    ring axis sees (U pieces per shard, H / U heads). ValueError for an unknown strategy, and for
    "ulysses" where the heads do not divide by the axis size."""
    check(strategy)
    B, S, H, D = q_shape
    K = k_shape[2]
    if strategy == "ulysses":
        if ulysses_size is not None:
            raise ValueError("strategy='ulysses' exchanges heads over axis_name itself; with "
                             "ulysses_axis set use strategy='ring' or 'all_gather' (Ulysses x ring)")
        if H % ring_size:
            raise ValueError(f"strategy='ulysses' needs the query heads divisible by the size of "
                             f"axis_name={axis_name!r}; got heads={H}, axis size {ring_size}")
    if strategy != "auto":
        return strategy
    allowed = STRATEGIES
    if ulysses_size is not None:  # the ring's view after the Ulysses exchange
        u = ulysses_size
        K = K * (ulysses.kv_repeats(H, K, u) if u > 1 else 1) // u
        S, H, allowed = S * u, H // u, ("ring", "all_gather")
    shape = Shape(B, S * ring_size, H, K, D, ring_size, dtype_bytes, causal)
    return choose(shape, platform_of(device), allowed=allowed).strategy


def gather_chunks(requested, shard: int, takes_shard=lambda n: True) -> int:
    """Pieces of the shard the all-gather sends one by one. None: 2 where the shard halves (and the
    kernel takes the half), else 1. ValueError unless a positive int dividing the shard."""
    if requested is None:
        return 2 if shard % 2 == 0 and takes_shard(shard // 2) else 1
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1 or \
            shard % requested:
        raise ValueError(f"gather_chunks={requested!r} must be a positive int dividing the shard "
                         f"length {shard}")
    return requested


# ---- the documented table ---------------------------------------------------------------------
# (heads, kv heads, head dim) of Llama 3.2 1B and Llama 3.1 8B attention (models/config.py)
REPRESENTATIVE = {"1b": (32, 8, 64), "8b": (32, 8, 128)}
DOC_SEQS = (32768, 131072, 1048576)
DOC_DEVICES = (8, 64)


def markdown(platform: str = "h100", seqs=DOC_SEQS, devices=DOC_DEVICES, shapes=None) -> str:
    """The choice and its numbers for representative shapes (batch 1, bfloat16, causal): the
    table of docs/api.md's "Strategies" section, one per platform."""
    p = PLATFORMS[platform]
    lines = [f"| {platform} model | tokens | N | shard | ring step compute / transfer (us) | "
             "fwd+bwd MiB ring / all_gather / ulysses | all_gather k/v GiB | choice |",
             "|---" * 8 + "|"]
    for model, (h, k, d) in (shapes or REPRESENTATIVE).items():
        for seq in seqs:
            for n in devices:
                dec = choose(Shape(1, seq, h, k, d, n), p)
                by = {r["strategy"]: r for r in dec.rows}
                mib = [f"{by[s]['bytes_fwd_bwd'] / 2**20:,.0f}" if s != "ulysses" or
                       by[s]["feasible"] else "n/a" for s in STRATEGIES]
                ring = by["ring"]
                lines.append(
                    f"| {model} | {seq // 1024}K | {n} | {seq // n:,} | "
                    f"{ring['step_compute_s'] * 1e6:,.1f} / {ring['step_transfer_s'] * 1e6:,.1f} | "
                    f"{' / '.join(mib)} | {by['all_gather']['kv_bytes'] / GIB:.2f} | "
                    f"{dec.strategy} |")
    return "\n".join(lines) + "\n"
