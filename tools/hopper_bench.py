"""The timing part of ``hopper_check.py``: the Pallas Mosaic GPU (Hopper) ring step next to cuDNN.

* ``bench`` (``--parts bench``, and ``sweep``: block sizes at one length): the bare step, forward
  and forward + backward with each ``--backwards`` variant, next to cuDNN and the Triton step, at
  B=1, bf16; ``--rounds`` interleaved passes (``time_round``), each measurement ``time_fn``: the
  median of ``--reps`` calls (or with ``--min-ms`` of as many as span that long); TFLOP/s
  (``flops``, as in ``benchmarks/attention.py``) and the ratio to cuDNN paired per pass;
* ``repeat`` (``--parts repeat``): bitwise reproducibility, each backward run five times on one
  problem, distinct results counted (with ``--cudnn-deterministic`` also cuDNN's two backwards).

The command line is ``hopper_check.py``'s, which sets ``REPS``, ``ROUNDS`` and ``CUDNN_DET`` here;
lines, records, budget and variants are ``hopper_run``'s.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import statistics
import time

import hopper_run  # beside this script
import jax
import jax.numpy as jnp
import numpy as np

from ringattention.kernels.hopper import pallas_hopper as ph
from ringattention.kernels.triton import pallas_gpu as pg

# --reps: timed calls per measurement (after a compile call and a warm-up call); --min-ms: more
# calls where they would span less than that (short problems, whose passes spread most)
REPS = {"n": 5, "min_ms": 0.0}
MAX_REPS = 100
ROUNDS = {"n": 1}  # --rounds: passes over all timed functions, interleaved (cuDNN, A, B, cuDNN, ...)
CUDNN_DET = {"on": False}  # --cudnn-deterministic: also cuDNN's deterministic backward


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


def timed_variants(d: int, causal: bool) -> dict:
    """{name: (forward fn or None, forward+backward fn)} of ``hopper_run.distinct_backwards(d)``."""
    fns, timed_fwd = {}, set()
    for backward, bs in hopper_run.distinct_backwards(d, "bench ", causal):
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


def _functions(length: int, causal: bool, d: int, sweep: bool, problem_args) -> dict:
    """{name: (forward, gradient | None)}: cuDNN (and its deterministic gradient), then the timed
    variants, or with ``sweep`` the forward tilings and the two-kernel backward's stage counts."""
    mosaic_bwd = dataclasses.replace(ph.default_block_sizes(d), backward="mosaic")
    fns = {"cudnn": cudnn_fns(causal)}
    if CUDNN_DET["on"] and not sweep:
        fns["cudnn deterministic"] = (None, cudnn_deterministic_grad(causal, problem_args))
    if not sweep:
        fns.update(timed_variants(d, causal))
        if "triton" in hopper_run.BACKWARDS:
            fns["pallas_gpu"] = step_fns(pg, causal)
        return fns
    for bk, st, sched in ((128, 2, "overlap"), (64, 2, "pingpong"), (64, 3, "pingpong"), (64, 4, "pingpong")):
        bs = ph.BlockSizes(block_k=bk, stages=st, schedule=sched)
        fns[f"pallas_hopper bk={bk} stages={st} schedule={sched}"] = (step_fns(ph, causal, bs)[0], None)
    for st in (3, 4):
        bs = dataclasses.replace(mosaic_bwd, bwd_stages=st)
        fns[f"pallas_hopper backward=mosaic bwd_stages={st}"] = step_fns(ph, causal, bs)
    return fns


def _log_times(rounds: list, todo: list, shape: str, meta: dict) -> None:
    """One ``time`` record per (variant, mode): the median over passes, and the median of each
    pass's ratio to cuDNN (and to cuDNN's deterministic gradient where timed)."""
    length, h, d, causal = meta["seq"], meta["heads"], meta["head_dim"], meta["causal"]
    for name, mode, _, _ in todo:
        ts = [t[(name, mode)] for t in rounds if (name, mode) in t]
        if not ts:
            continue
        sec = statistics.median(ts)
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
        hopper_run.log(
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


def bench(length: int, causal: bool, h: int = 32, kvh: int = 32, d: int = 128, sweep: bool = False):
    q, k, v, do = problem(length, h, kvh, d, seed=length)
    fns = _functions(length, causal, d, sweep, (q, k, v, do))
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
    _log_times(rounds, todo, shape, meta)


def time_round(todo: list, label: str, compiled: bool) -> dict:
    """One pass of ``time_fn`` over ``todo`` [(name, mode, fn, args)]: {(name, mode): seconds}. A
    function that fails is reported and dropped from ``todo``; no new timing past the budget."""
    out = {}
    for item in list(todo):
        name, mode, g, args = item
        if time.perf_counter() - hopper_run.T0 > hopper_run.BUDGET_S:
            break
        try:
            out[(name, mode)] = time_fn(g, args, compiled=compiled)
        except Exception as e:  # noqa: BLE001 - report and go on
            hopper_run.log(
                f"ERROR time {name} {mode} {label}: {hopper_run.short_exc(e)}",
                kind="time_error",
                name=name,
                mode=mode,
                label=label,
                error=hopper_run.short_exc(e),
            )
            todo.remove(item)
    if ROUNDS["n"] > 1:  # each pass on record too, in case the watchdog ends the run
        hopper_run.log(
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
        for backward, bs in hopper_run.distinct_backwards(d, "repeat ", causal)
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
        hopper_run.log(
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
