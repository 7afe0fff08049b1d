"""On-device check of the Pallas Mosaic GPU (Hopper) ring step, then its speed next to cuDNN.

One run on an H100/H200 (no network needed), well under five minutes:

1. kernel matrix: ``pallas_hopper.forward_step`` / ``backward_step`` on small ring-step problems
   (causal with the query block after / overlapping / before the key block, segment ids with random
   boundaries, GQA and MHA, head dims 64, 80, 128, 192 and 256, bf16 and fp16, shards that are not a
   multiple of the block, sliding windows: ``--cases window``) against the float32 step reference;
   one PASS/FAIL line per case;
2. ``ring_attention(implementation="pallas_hopper")`` on a one-device mesh against the reference
   (head dims ``--ring-dims``);
3. timing of the bare step (forward, forward + backward with each backward: triton, mosaic and the
   fused one) at B=1, bf16, ``--shapes`` heads:kv_heads:head_dim (default 32:32:128), ``--seqs``
   tokens, ``--causal`` 1 and/or 0, next to cuDNN and the Triton step, with TFLOP/s and ratios
   (``--rounds N``: N interleaved passes over cuDNN and the variants, each pass's ratios paired, so
   that a clock that drifts during the run moves both sides of a ratio; each measurement the
   median of ``--reps`` calls, or with ``--min-ms`` of as many as span that long);
4. bitwise reproducibility (``--parts repeat``): each backward run five times on one problem per
   ``--shapes`` entry, counting distinct results (``--cudnn-deterministic``: timing and repeats
   also of cuDNN's backward compiled with XLA's ``xla_gpu_deterministic_ops``, the bar for
   ``deterministic=True``);
5. a block-size sweep at 16K tokens (forward tiles, backward stages).

A ``--backwards`` entry that resolves to the same BlockSizes as an earlier one at a head dim (e.g.
"default" and "mosaic" at 256), or that does not apply there ("fused" above head dim 128, where
the Mosaic backward is "mosaic"), is skipped with a "note" line.

Every case catches its own exception (printed, traceback cut short) so one failure hides nothing;
the output files are rewritten after every line, and a watchdog writes them and exits if the run
passes ``--hard-limit`` seconds (a hung kernel: the last "RUN" line names it). ``--parts`` reruns a
subset, ``--cases`` some of the step cases; ``--backwards`` lists the variants to check and time,
each a backward name (or "default", or "deterministic": the tiles of ``deterministic=True`` at
each head dim) with BlockSizes fields, e.g. ``mosaic/bwd_stages=3``;
``--causal 1,0`` and ``--dim`` choose the timed problems; ``--interpret`` is a CPU dry run of the
checks in Mosaic GPU interpret mode (give it
``XLA_FLAGS=--xla_force_host_platform_device_count=8``: with one CPU device the interpreter's
warpgroup threads can starve each other and hang).

  PYTHONPATH=. python3 tools/hopper_check.py --out $OUT/hopper_check

writes ``<out>.json`` and ``<out>.txt``. FLOPs as in ``benchmarks/attention.py``: forward
4*B*H*L*L*D (halved when causal), forward + backward 3.5x that.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import statistics
import sys
import threading
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import ringattention
from ringattention import implementations
from ringattention.kernels.hopper import pallas_hopper as ph
from ringattention.kernels.triton import pallas_gpu as pg

# Relative Frobenius-norm error bounds against the float32 reference (inputs rounded alike).
RTOL = {"bfloat16": 2e-2, "float16": 1e-2}
LSE_ATOL = 1e-3  # natural-log units, finite rows
BUDGET_S = 250.0  # start no new work after this many seconds
HARD_LIMIT_S = 290.0  # a watchdog writes what there is and exits (e.g. a kernel that hangs)
T0 = time.perf_counter()
LINES: list[str] = []
RECORDS: list[dict] = []
OUT = {"prefix": "hopper_check"}
# --reps: timed calls per measurement (after a compile call and a warm-up call); --min-ms: more
# calls where they would span less than that (short problems, whose passes spread most)
REPS = {"n": 5, "min_ms": 0.0}
MAX_REPS = 100
ROUNDS = {"n": 1}  # --rounds: passes over all timed functions, interleaved (cuDNN, A, B, cuDNN, ...)
BACKWARDS = list(ph.BACKWARDS)  # --backwards: the variants to check and time
CUDNN_DET = {"on": False}  # --cudnn-deterministic: also cuDNN's deterministic backward


def _field_value(text: str):
    """A --backwards field's value: an int, a bool ("true" / "false"), None ("none"), else the
    string."""
    if text.lstrip("-").isdigit():
        return int(text)
    return {"true": True, "false": False, "none": None}.get(text, text)


def block_sizes(spec: str, d: int, causal: bool = True) -> ph.BlockSizes:
    """A --backwards entry, "name[/field=value...]" (e.g. "mosaic/bwd_block_k=128",
    "default/schedule=overlap"), as BlockSizes: the defaults for head dim ``d`` and ``causal`` with
    that backward ("default": the default's; "deterministic": what ``ring_attention(...,
    deterministic=True)`` runs there, ``pallas_hopper.deterministic_block_sizes``) and those
    fields."""
    name, *fields = spec.split("/")
    over = {k: _field_value(v) for k, v in (f.split("=") for f in fields)}
    if name == "deterministic":
        return dataclasses.replace(ph.deterministic_block_sizes(None, d, causal), **over)
    if name != "default":
        over["backward"] = name
    return dataclasses.replace(ph.default_block_sizes(d, causal), **over)


INTERPRET = {"on": False}  # --interpret: a CPU dry run of the checks in Mosaic GPU interpret mode


def write_out():
    with open(OUT["prefix"] + ".json", "w") as fh:
        json.dump(dict(lines=LINES, records=RECORDS), fh, indent=1)
    with open(OUT["prefix"] + ".txt", "w") as fh:
        fh.write("\n".join(LINES) + "\n")


def log(line: str, **record):
    print(line, flush=True)
    LINES.append(line)
    if record:
        RECORDS.append(record)
    write_out()


def watchdog(limit: float):
    time.sleep(limit)
    log(
        f"WATCHDOG: still running after {limit:.0f}s (a hung kernel?); the last RUN line "
        "names the case; exiting",
        kind="watchdog",
    )
    os._exit(3)


def short_exc(e: BaseException) -> str:
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    text = "".join(tb[-3:])
    return text[-1500:]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    causal: bool = True
    where: str = "overlap"  # query block "after" / "overlap" / "before" the key block
    segments: bool = False
    heads: int = 4
    kv_heads: int = 2
    dim: int = 64
    dtype: str = "bfloat16"
    sq: int = 256
    sk: int = 256
    stride: int = 1  # positions step (striped layout: ring size)
    window: int | None = None  # sliding window (passed as window=W to the steps and the reference)


CASES = [
    Case("causal-overlap-gqa-d64-bf16"),
    Case("causal-after-gqa-d64-bf16", where="after"),
    Case("causal-before-gqa-d64-bf16 (all hidden)", where="before"),
    Case("noncausal-mha-d64-bf16", causal=False, kv_heads=4),
    Case("noncausal-gqa-d128-bf16", causal=False, dim=128),  # no mask: the flat group loop
    Case("ragged-noncausal-gqa4-d64-bf16", causal=False, heads=8, sq=200, sk=328),
    Case("causal-overlap-seg-gqa-d64-bf16", segments=True),
    Case("noncausal-seg-mha-d128-bf16", causal=False, segments=True, kv_heads=4, dim=128),
    Case("causal-overlap-mha-d128-bf16", kv_heads=4, dim=128),
    Case("causal-after-seg-gqa-d128-fp16", where="after", segments=True, dim=128, dtype="float16"),
    Case("causal-overlap-gqa-d64-fp16", dtype="float16"),
    Case("ragged-causal-overlap-seg-gqa-d64-bf16", segments=True, sq=200, sk=328),
    Case("ragged-noncausal-mha-d128-fp16", causal=False, kv_heads=4, dim=128, dtype="float16", sq=136, sk=72),
    Case("ragged-causal-striped-seg-d80-bf16", segments=True, dim=80, sq=190, sk=190, stride=4),
    Case("long-causal-overlap-seg-gqa-d128-bf16", segments=True, dim=128, sq=1024, sk=1536),
    # head dims 129-256: the head-dim-split pair (split_bwd), forward at block_k=64
    Case("causal-overlap-seg-gqa-d256-bf16", segments=True, dim=256),
    Case("noncausal-mha-d256-fp16", causal=False, kv_heads=4, dim=256, dtype="float16"),
    Case("causal-before-gqa-d256-bf16 (all hidden)", where="before", dim=256),
    Case("ragged-causal-after-gqa-d192-bf16", where="after", dim=192, sq=200, sk=328),
    Case("ragged-noncausal-gqa4-d256-bf16", causal=False, heads=8, dim=256, sq=200, sk=136),
    Case("long-d256-causal-overlap-seg-gqa-bf16", segments=True, dim=256, sq=1024, sk=1536),
    # sliding windows: masked blocks at the window's far edge, fully visible ones, the diagonal
    Case("window300-causal-overlap-seg-gqa-d64-bf16", segments=True, window=300),
    Case("window200-noncausal-mha-d128-bf16", causal=False, kv_heads=4, dim=128, window=200),
    Case("window200-causal-overlap-gqa-d256-bf16", dim=256, window=200),
    Case(
        "window150-ragged-noncausal-seg-gqa-d192-fp16",
        causal=False,
        segments=True,
        dim=192,
        dtype="float16",
        sq=200,
        sk=328,
        window=150,
    ),
]


def step_inputs(c: Case, rng):
    dt = jnp.dtype(c.dtype)
    f = lambda *s: jnp.asarray(rng.standard_normal(s), dt)  # noqa: E731
    q, do = f(2, c.sq, c.heads, c.dim), f(2, c.sq, c.heads, c.dim)
    k, v = f(2, c.sk, c.kv_heads, c.dim), f(2, c.sk, c.kv_heads, c.dim)
    off = {"after": c.sk * c.stride, "overlap": (c.sk * c.stride) // 2, "before": -c.sq * c.stride}
    q_pos = jnp.asarray(np.arange(c.sq) * c.stride + off[c.where], jnp.int32)
    k_pos = jnp.asarray(np.arange(c.sk) * c.stride, jnp.int32)
    q_seg = k_seg = None
    if c.segments:  # random document boundaries over the union of positions
        top = int(max(q_pos.max(), k_pos.max())) + 1
        cuts = np.sort(rng.choice(np.arange(1, top), size=4, replace=False))
        ids = lambda pos: np.broadcast_to(
            np.searchsorted(cuts, np.asarray(pos), "right"),  # noqa: E731
            (2, pos.shape[0]),
        )
        q_seg, k_seg = jnp.asarray(ids(q_pos), jnp.int32), jnp.asarray(ids(k_pos), jnp.int32)
    return q, k, v, do, q_pos, k_pos, q_seg, k_seg


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run_case(c: Case):
    rng = np.random.default_rng(sum(map(ord, c.name)))
    q, k, v, do, q_pos, k_pos, q_seg, k_seg = step_inputs(c, rng)
    kw = dict(causal=c.causal, softmax_scale=c.dim**-0.5)
    if c.window is not None:
        kw["window"] = c.window
    ro, rlse = jax.jit(lambda *a: pg.reference_forward_step(*a, **kw))(q, k, v, q_pos, k_pos, q_seg, k_seg)
    tol = RTOL[c.dtype]
    guarded(f"step-fwd {c.name}", check_forward, c, kw, tol, (q, k, v, q_pos, k_pos, q_seg, k_seg), ro, rlse)
    delta = jnp.einsum("bshd,bshd->bhs", ro, do.astype(jnp.float32))
    args = (q, k, v, do, rlse, delta, q_pos, k_pos, q_seg, k_seg)
    want = jax.jit(lambda *a: pg.reference_backward_step(*a, **kw))(*args)
    for backward, _ in distinct_backwards(c.dim, f"{c.name} ", c.causal):
        guarded(f"step-bwd[{backward}] {c.name}", check_backward, c, kw, tol, args, want, backward)


def err_or_zero(got, want) -> float:
    """Relative error, or the largest magnitude where the reference is exactly zero."""
    if np.any(np.asarray(want)):
        return rel(got, want)
    return float(np.abs(np.asarray(got)).max())


def check_forward(c: Case, kw, tol, args, ro, rlse):
    o, lse = jax.jit(lambda *a: ph.forward_step(*a, interpret=INTERPRET["on"], **kw))(*args)
    lse, rlse = np.asarray(lse), np.asarray(rlse)
    inf_ok = bool(np.array_equal(np.isneginf(lse), np.isneginf(rlse)))
    fin = np.isfinite(rlse)
    lse_err = float(np.abs(lse[fin] - rlse[fin]).max()) if fin.any() else 0.0
    o_err = err_or_zero(o, ro)
    ok = inf_ok and lse_err <= LSE_ATOL and o_err <= tol
    log(
        f"{'PASS' if ok else 'FAIL'} step-fwd {c.name}: o={o_err:.2e} lse_maxabs={lse_err:.2e} "
        f"neg_inf_rows_match={inf_ok} (rtol={tol}, lse_atol={LSE_ATOL})",
        kind="step_fwd",
        case=dataclasses.asdict(c),
        passed=ok,
        o=o_err,
        lse_err=lse_err,
        inf_ok=inf_ok,
    )


def check_backward(c: Case, kw, tol, args, want, backward: str):
    bs = block_sizes(backward, c.dim)
    got = jax.jit(lambda *a: ph.backward_step(*a, block_sizes=bs, interpret=INTERPRET["on"], **kw))(*args)
    errs = {n: err_or_zero(g, w) for n, g, w in zip(("dq", "dk", "dv"), got, want, strict=True)}
    ok = all(e <= tol for e in errs.values())
    detail = " ".join(f"{n}={e:.2e}" for n, e in errs.items())
    log(
        f"{'PASS' if ok else 'FAIL'} step-bwd[{backward}] {c.name}: {detail} (rtol={tol})",
        kind="step_bwd",
        backward=backward,
        case=dataclasses.asdict(c),
        passed=ok,
        **errs,
    )


def run_ring_check(causal: bool, segments: bool, dtype: str, kv_heads: int, backward: str, D: int = 128):
    name = f"ring N=1 causal={causal} seg={segments} {dtype} H=4 K={kv_heads} L=640 D={D} backward={backward}"
    bs = block_sizes(backward, D, causal)
    rng = np.random.default_rng(7)
    B, L, H = 1, 640, 4
    f = lambda *s: jnp.asarray(rng.standard_normal(s), dtype)  # noqa: E731
    q, k, v, do = f(B, L, H, D), f(B, L, kv_heads, D), f(B, L, kv_heads, D), f(B, L, H, D)
    seg = None
    if segments:
        cuts = np.sort(rng.choice(np.arange(1, L), size=3, replace=False))
        seg = jnp.asarray(np.searchsorted(cuts, np.arange(L), "right")[None], jnp.int32)
    mesh = Mesh(np.array(jax.devices()[:1]), ("sp",))

    def ring(q, k, v, seg):
        return ringattention.ring_attention(
            q,
            k,
            v,
            "sp",
            causal=causal,
            segment_ids=seg,
            implementation="pallas_hopper",
            block_sizes=bs,
            interpret=INTERPRET["on"],
        )

    sm = jax.shard_map(
        ring, mesh=mesh, in_specs=(P(None, "sp"),) * 4, out_specs=P(None, "sp"), check_vma=False
    )
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731

    def ref(q, k, v, seg):
        return ringattention.reference_attention(f32(q), f32(k), f32(v), causal=causal, segment_ids=seg)

    def with_grads(fn):
        def loss(q, k, v):
            return jnp.sum(f32(fn(q, k, v, seg)) * f32(do))

        return jax.jit(lambda q, k, v: (fn(q, k, v, seg), *jax.grad(loss, (0, 1, 2))(q, k, v)))

    got, want = with_grads(sm)(q, k, v), with_grads(ref)(q, k, v)
    errs = {n: rel(g, w) for n, g, w in zip(("o", "dq", "dk", "dv"), got, want, strict=True)}
    ok = all(e <= RTOL[dtype] for e in errs.values())
    detail = " ".join(f"{n}={e:.2e}" for n, e in errs.items())
    log(
        f"{'PASS' if ok else 'FAIL'} {name}: {detail} (rtol={RTOL[dtype]})",
        kind="ring",
        name=name,
        passed=ok,
        **errs,
    )


def timed_calls(warm_s: float) -> int:
    """Calls per measurement for a function whose warm-up call took ``warm_s``: --reps, or as many
    as span --min-ms (at most MAX_REPS)."""
    min_ms = REPS["min_ms"]
    want = math.ceil(min_ms / max(warm_s * 1e3, 1e-3)) if min_ms > 0 else 0
    return max(REPS["n"], min(want, MAX_REPS))


def time_fn(fn, args, compiled: bool = False):
    """Median seconds of ``timed_calls`` calls of ``fn(*args)``, after a warm-up call (and a compile
    call unless ``compiled``)."""
    if not compiled:
        jax.block_until_ready(fn(*args))  # compile
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))  # warm-up
    warm = time.perf_counter() - t
    ts = []
    for _ in range(timed_calls(warm)):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def flops(h, length, d, causal, mode):
    f = 4.0 * h * length * length * d * (0.5 if causal else 1.0)
    return f * (3.5 if mode == "fwdbwd" else 1.0)


def step_fns(mod, causal, block_sizes=None):
    kw = dict(causal=causal, block_sizes=block_sizes)

    def fwd(q, k, v):
        pos = jnp.arange(q.shape[1], dtype=jnp.int32)
        return mod.forward_step(q, k, v, pos, pos, None, None, softmax_scale=q.shape[-1] ** -0.5, **kw)

    def fwdbwd(q, k, v, do):
        pos = jnp.arange(q.shape[1], dtype=jnp.int32)
        o, lse = fwd(q, k, v)
        delta = jnp.einsum("bshd,bshd->bhs", o, do.astype(jnp.float32))
        return mod.backward_step(
            q, k, v, do, lse, delta, pos, pos, None, None, softmax_scale=q.shape[-1] ** -0.5, **kw
        )

    return jax.jit(lambda q, k, v: fwd(q, k, v)[0].astype(q.dtype)), jax.jit(fwdbwd)


def cudnn_fns(causal):
    def fwd(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")

    def loss(q, k, v, do):
        return jnp.sum(fwd(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))

    return jax.jit(fwd), jax.jit(jax.grad(loss, (0, 1, 2)))


def cudnn_deterministic_grad(causal, args):
    """cuDNN's forward+backward compiled with XLA's ``xla_gpu_deterministic_ops``, under which XLA
    asks cuDNN for its deterministic backward (the same-run bar of ``deterministic=True``)."""
    return cudnn_fns(causal)[1].lower(*args).compile(compiler_options={"xla_gpu_deterministic_ops": True})


def distinct_backwards(d: int, label: str = "", causal: bool = True) -> list[tuple[str, ph.BlockSizes]]:
    """The --backwards entries at head dim ``d`` (``causal`` or not) as (entry, BlockSizes); an
    entry that resolves to the BlockSizes of an earlier one, or that does not apply at this head
    dim ("fused" above head dim 128), is left out with a line saying so."""
    out, seen = [], {}
    for backward in BACKWARDS:
        bs = block_sizes(backward, d, causal)
        if bs in seen:
            log(f"note {label}D={d}: backward={backward} is backward={seen[bs]} (same BlockSizes)")
        elif bs.backward == "fused" and d > 128:
            log(
                f"note {label}D={d}: backward={backward}: the fused backward applies at head dims "
                "<= 128 only (above, 'mosaic')"
            )
        else:
            seen[bs] = backward
            out.append((backward, bs))
    return out


def timed_variants(d: int, causal: bool) -> dict:
    """{name: (forward fn or None, forward+backward fn)} of ``distinct_backwards(d)``."""
    fns, timed_fwd = {}, set()
    for backward, bs in distinct_backwards(d, "bench ", causal):
        f, fb = step_fns(ph, causal, bs)
        fwd_key = dataclasses.replace(bs, backward="mosaic", bwd_stages=2, bwd_block_k=64, split_group=False)
        fns[f"pallas_hopper backward={backward}"] = (None if fwd_key in timed_fwd else f, fb)
        timed_fwd.add(fwd_key)  # a forward is timed once per distinct forward configuration
    return fns


def problem(length: int, h: int, kvh: int, d: int, seed: int):
    """Random bf16 q, k, v, do at B=1: q, do [1, length, h, d], k, v [1, length, kvh, d]."""
    rng = jax.random.split(jax.random.PRNGKey(seed), 4)
    q, do = (jax.random.normal(r, (1, length, h, d), jnp.bfloat16) for r in rng[:2])
    k, v = (jax.random.normal(r, (1, length, kvh, d), jnp.bfloat16) for r in rng[2:])
    return q, k, v, do


def bench(length: int, causal: bool, h: int = 32, kvh: int = 32, d: int = 128, sweep: bool = False):
    q, k, v, do = problem(length, h, kvh, d, seed=length)
    mosaic_bwd = dataclasses.replace(ph.default_block_sizes(d), backward="mosaic")
    fns = {"cudnn": cudnn_fns(causal)}
    if CUDNN_DET["on"] and not sweep:
        fns["cudnn deterministic"] = (None, cudnn_deterministic_grad(causal, (q, k, v, do)))
    if not sweep:
        fns.update(timed_variants(d, causal))
        if "triton" in BACKWARDS:
            fns["pallas_gpu"] = step_fns(pg, causal)
    else:
        for bk, st, sched in (
            (128, 2, "overlap"),
            (64, 2, "pingpong"),
            (64, 3, "pingpong"),
            (64, 4, "pingpong"),
        ):
            bs = ph.BlockSizes(block_k=bk, stages=st, schedule=sched)
            fns[f"pallas_hopper bk={bk} stages={st} schedule={sched}"] = (step_fns(ph, causal, bs)[0], None)
        for st in (3, 4):
            bs = dataclasses.replace(mosaic_bwd, bwd_stages=st)
            fns[f"pallas_hopper backward=mosaic bwd_stages={st}"] = step_fns(ph, causal, bs)
    shape = f"{h}:{kvh}:{d}"
    todo = [
        (name, mode, g, args)
        for name, (f, fb) in fns.items()
        for mode, g, args in (("fwd", f, (q, k, v)), ("fwdbwd", fb, (q, k, v, do)))
        if g is not None
    ]
    rounds = []  # one {(name, mode): seconds} per pass; passes interleave the functions
    for r in range(ROUNDS["n"]):
        rounds.append(time_round(todo, f"L={length} {shape}", compiled=r > 0))
    meta = dict(seq=length, heads=h, kv_heads=kvh, head_dim=d, causal=causal)
    for name, mode, _, _ in todo:
        ts = [t[(name, mode)] for t in rounds if (name, mode) in t]
        if not ts:
            continue
        sec = statistics.median(ts)
        # the ratio: the median over passes of each pass's own ratio to cuDNN
        ratios = [
            t[("cudnn", mode)] / t[(name, mode)] for t in rounds if (name, mode) in t and ("cudnn", mode) in t
        ]
        ratio = statistics.median(ratios) if ratios else float("nan")
        det = [
            t[("cudnn deterministic", mode)] / t[(name, mode)]
            for t in rounds
            if (name, mode) in t and ("cudnn deterministic", mode) in t
        ]
        det_ratio = statistics.median(det) if det else None
        tf = flops(h, length, d, causal, mode) / sec / 1e12
        log(
            f"time L={length} {shape} causal={causal} {mode:6s} {name}: {sec * 1e3:8.2f} ms "
            f"{tf:6.1f} TFLOP/s  x{ratio:.2f} of cuDNN"
            + (f", x{det_ratio:.2f} of cuDNN deterministic" if det_ratio is not None else "")
            + (f" ({len(ts)} rounds)" if ROUNDS["n"] > 1 else ""),
            kind="time",
            name=name,
            mode=mode,
            ms=sec * 1e3,
            tflops=tf,
            vs_cudnn=ratio,
            vs_cudnn_passes=ratios,
            vs_cudnn_deterministic=det_ratio,
            rounds=len(ts),
            **meta,
        )


def time_round(todo: list, label: str, compiled: bool) -> dict:
    """One pass of ``time_fn`` over ``todo`` [(name, mode, fn, args)]: {(name, mode): seconds}. A
    function that fails is reported and dropped from ``todo``; no new timing past the budget."""
    out = {}
    for item in list(todo):
        name, mode, g, args = item
        if time.perf_counter() - T0 > BUDGET_S:
            break
        try:
            out[(name, mode)] = time_fn(g, args, compiled=compiled)
        except Exception as e:  # noqa: BLE001 - report and go on
            log(
                f"ERROR time {name} {mode} {label}: {short_exc(e)}",
                kind="time_error",
                name=name,
                mode=mode,
                label=label,
                error=short_exc(e),
            )
            todo.remove(item)
    if ROUNDS["n"] > 1:  # each pass on record too, in case the watchdog ends the run
        log(
            f"round {label}: " + ", ".join(f"{n} {m} {t * 1e3:.2f} ms" for (n, m), t in out.items()),
            kind="time_round",
            label=label,
            ms={f"{n} {m}": t * 1e3 for (n, m), t in out.items()},
        )
    return out


def fixed_order(bs: ph.BlockSizes) -> bool:
    """Whether a backward claims a fixed order of its sums: all but the fused one, whose dq arrives
    by reduce-adds in the order the key CTAs run."""
    return bs.backward != "fused"


def repeat(length: int, causal: bool, h: int, kvh: int, d: int, n: int = 5) -> None:
    """Bitwise reproducibility: each backward's forward + backward ``n`` times on the same inputs,
    counting distinct results (dq, dk, dv bytes). The backwards that claim a fixed order of their
    sums (``fixed_order``) PASS with one and FAIL with more; the others are reported (INFO)."""
    q, k, v, do = problem(length, h, kvh, d, seed=length + 1)
    todo = [
        (backward, fixed_order(bs), step_fns(ph, causal, bs)[1])
        for backward, bs in distinct_backwards(d, "repeat ", causal)
    ]
    if CUDNN_DET["on"]:  # cuDNN's two backwards: a fixed order claimed by the deterministic one
        todo += [
            ("cudnn", False, cudnn_fns(causal)[1]),
            ("cudnn deterministic", True, cudnn_deterministic_grad(causal, (q, k, v, do))),
        ]
    for backward, fixed, fb in todo:
        digests = set()
        for _ in range(n):
            got = jax.device_get(fb(q, k, v, do))
            digests.add(hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in got)).hexdigest())
        verdict = ("PASS" if len(digests) == 1 else "FAIL") if fixed else "INFO"
        log(
            f"{verdict} repeat[{backward}] L={length} {h}:{kvh}:{d} causal={causal}: "
            f"{len(digests)} distinct of {n} (order fixed: {fixed})",
            kind="repeat",
            backward=backward,
            seq=length,
            shape=f"{h}:{kvh}:{d}",
            causal=causal,
            n=n,
            distinct=len(digests),
            passed=(len(digests) == 1) if fixed else None,
        )


def guarded(label, fn, *args):
    if time.perf_counter() - T0 > BUDGET_S:
        log(f"SKIP {label}: time budget spent", kind="skip", name=label)
        return
    print(f"RUN {label}", flush=True)
    LINES.append(f"RUN {label} (t={time.perf_counter() - T0:.0f}s)")
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - one failure must not hide the rest
        log(f"ERROR {label}: {short_exc(e)}", kind="error", name=label, error=short_exc(e))


def parse_shapes(spec: str, seqs: list[int]) -> list[tuple[int, int, int, list[int]]]:
    """--shapes "32:8:128@65536,16:16:256" -> [(32, 8, 128, [65536]), (16, 16, 256, seqs)]: each
    heads:kv_heads:head_dim, optionally with its own "+"-separated token counts after "@"."""
    out = []
    for entry in spec.split(","):
        shape, _, own = entry.partition("@")
        h, kvh, d = (int(x) for x in shape.split(":"))
        out.append((h, kvh, d, [int(x) for x in own.split("+")] if own else seqs))
    return out


def run_parts(args, parts: set[str]) -> None:
    """The selected parts, in the order steps, ring, bench, repeat, sweep."""
    if "steps" in parts:
        wanted = [w for w in args.cases.split(",") if w]
        for c in CASES:
            if wanted and not any(w in c.name for w in wanted):
                continue
            if not (args.interpret and c.sq * c.sk > 300 * 300):
                guarded(f"step {c.name}", run_case, c)
    if "ring" in parts:
        for d in (int(x) for x in args.ring_dims.split(",")):
            for ring_args in ((True, True, "bfloat16", 2), (False, False, "float16", 4)):
                for backward, _ in distinct_backwards(d, "ring ", ring_args[0]):
                    guarded(f"ring {ring_args} D={d} {backward}", run_ring_check, *ring_args, backward, d)
    seqs = [int(s) for s in args.seqs.split(",")]
    if "bench" in parts and not args.interpret:
        for h, kvh, d, shape_seqs in parse_shapes(args.shapes, seqs):
            for length in shape_seqs:
                for causal in [c == "1" for c in args.causal.split(",")]:
                    guarded(
                        f"bench L={length} {h}:{kvh}:{d} causal={causal}", bench, length, causal, h, kvh, d
                    )
    if "repeat" in parts and not args.interpret:
        for h, kvh, d, shape_seqs in parse_shapes(args.shapes, seqs):
            for causal in [c == "1" for c in args.causal.split(",")]:
                guarded(
                    f"repeat L={shape_seqs[0]} {h}:{kvh}:{d} causal={causal}",
                    repeat,
                    shape_seqs[0],
                    causal,
                    h,
                    kvh,
                    d,
                )
    if "sweep" in parts and not args.interpret:
        guarded("sweep", bench, seqs[0], True, 32, 32, 128, True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="hopper_check", help="path prefix for .json and .txt")
    ap.add_argument("--seqs", default="16384,65536")
    ap.add_argument(
        "--parts",
        default="steps,ring,bench,sweep",
        help="comma-separated subset of steps,ring,bench,repeat,sweep (run in this "
        "order; repeat: bitwise reproducibility of each backward at the first "
        "length of each --shapes entry)",
    )
    ap.add_argument(
        "--backwards",
        default=",".join(ph.BACKWARDS),
        help="comma-separated backwards to check and time, each name[/field=value...] "
        "(e.g. mosaic/bwd_block_k=128; names: default, deterministic, " + ", ".join(ph.BACKWARDS) + ")",
    )
    ap.add_argument("--causal", default="1", help="bench: comma-separated 1/0")
    ap.add_argument(
        "--dim",
        type=int,
        default=128,
        help="head dim of the timed problems (bench), when --shapes is not given",
    )
    ap.add_argument(
        "--shapes",
        default="",
        help="bench: comma-separated heads:kv_heads:head_dim[@seq+seq...] (default 32:32:<--dim> at --seqs)",
    )
    ap.add_argument("--reps", type=int, default=5, help="bench: timed calls per measurement")
    ap.add_argument(
        "--min-ms",
        type=float,
        default=0.0,
        help=f"bench: more calls than --reps where they would span less than this many "
        f"ms (at most {MAX_REPS})",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="bench: passes over cuDNN and the variants, interleaved; ms is the median "
        "over passes, the ratio the median of each pass's ratio",
    )
    ap.add_argument("--ring-dims", default="128", help="ring: comma-separated head dims")
    ap.add_argument(
        "--cases", default="", help="comma-separated substrings: run only the step cases whose name has one"
    )
    ap.add_argument("--interpret", action="store_true", help="CPU dry run (small cases, no timing)")
    ap.add_argument(
        "--cudnn-deterministic",
        action="store_true",
        help="bench and repeat: also cuDNN's backward under xla_gpu_deterministic_ops",
    )
    ap.add_argument(
        "--hard-limit",
        type=float,
        default=HARD_LIMIT_S,
        help="seconds after which the watchdog writes the output and exits",
    )
    args = ap.parse_args()
    global BUDGET_S
    BUDGET_S = args.hard_limit - (HARD_LIMIT_S - BUDGET_S)  # start nothing new near the limit
    parts = set(args.parts.split(","))
    BACKWARDS[:] = [b for b in args.backwards.split(",") if b]
    for spec in BACKWARDS:
        try:
            block_sizes(spec, 128)
        except (ValueError, TypeError) as e:
            ap.error(f"--backwards entry {spec!r}: {e} (names: {ph.BACKWARDS})")
    OUT["prefix"] = args.out
    args.shapes = args.shapes or f"32:32:{args.dim}"
    REPS["n"], REPS["min_ms"] = args.reps, args.min_ms
    ROUNDS["n"] = args.rounds
    CUDNN_DET["on"] = args.cudnn_deterministic
    INTERPRET["on"] = args.interpret
    threading.Thread(target=watchdog, args=(args.hard_limit,), daemon=True).start()
    if args.interpret and jax.device_count() < 2:
        log(
            "WARNING: --interpret with one CPU device may hang; set "
            "XLA_FLAGS=--xla_force_host_platform_device_count=8"
        )
    dev = jax.devices()[0]
    log(
        f"jax {jax.__version__}, {dev.device_kind}, compute capability "
        f"{getattr(dev, 'compute_capability', '?')}, pallas_hopper available: {ph.available()}, "
        f"auto -> {implementations.resolve('auto').name}, python {sys.version.split()[0]}"
    )
    try:
        run_parts(args, parts)
    finally:
        n_pass = sum(1 for r in RECORDS if r.get("passed") is True)
        n_fail = sum(1 for r in RECORDS if r.get("passed") is False)
        n_err = sum(1 for r in RECORDS if r.get("kind") in ("error", "time_error"))
        log(f"SUMMARY pass={n_pass} fail={n_fail} errors={n_err} elapsed={time.perf_counter() - T0:.0f}s")


if __name__ == "__main__":
    main()
