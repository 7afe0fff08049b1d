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

This file holds the command line and the checks (parts 1 and 2); the timing and the repeats (parts
3 to 5) are ``hopper_bench.py``'s; what all parts share (the output lines and records, the time
budget and watchdog, the ``--backwards`` entries) is ``hopper_run.py``'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading
import time

import hopper_bench  # beside this script
import hopper_run
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
INTERPRET = {"on": False}  # --interpret: a CPU dry run of the checks in Mosaic GPU interpret mode


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
    hopper_run.guarded(
        f"step-fwd {c.name}", check_forward, c, kw, tol, (q, k, v, q_pos, k_pos, q_seg, k_seg), ro, rlse
    )
    delta = jnp.einsum("bshd,bshd->bhs", ro, do.astype(jnp.float32))
    args = (q, k, v, do, rlse, delta, q_pos, k_pos, q_seg, k_seg)
    want = jax.jit(lambda *a: pg.reference_backward_step(*a, **kw))(*args)
    for backward, _ in hopper_run.distinct_backwards(c.dim, f"{c.name} ", c.causal):
        hopper_run.guarded(f"step-bwd[{backward}] {c.name}", check_backward, c, kw, tol, args, want, backward)


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
    hopper_run.log(
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
    bs = hopper_run.block_sizes(backward, c.dim)
    got = jax.jit(lambda *a: ph.backward_step(*a, block_sizes=bs, interpret=INTERPRET["on"], **kw))(*args)
    errs = {n: err_or_zero(g, w) for n, g, w in zip(("dq", "dk", "dv"), got, want, strict=True)}
    ok = all(e <= tol for e in errs.values())
    detail = " ".join(f"{n}={e:.2e}" for n, e in errs.items())
    hopper_run.log(
        f"{'PASS' if ok else 'FAIL'} step-bwd[{backward}] {c.name}: {detail} (rtol={tol})",
        kind="step_bwd",
        backward=backward,
        case=dataclasses.asdict(c),
        passed=ok,
        **errs,
    )


def run_ring_check(causal: bool, segments: bool, dtype: str, kv_heads: int, backward: str, D: int = 128):
    name = f"ring N=1 causal={causal} seg={segments} {dtype} H=4 K={kv_heads} L=640 D={D} backward={backward}"
    bs = hopper_run.block_sizes(backward, D, causal)
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
    hopper_run.log(
        f"{'PASS' if ok else 'FAIL'} {name}: {detail} (rtol={RTOL[dtype]})",
        kind="ring",
        name=name,
        passed=ok,
        **errs,
    )


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
                hopper_run.guarded(f"step {c.name}", run_case, c)
    if "ring" in parts:
        for d in (int(x) for x in args.ring_dims.split(",")):
            for ring_args in ((True, True, "bfloat16", 2), (False, False, "float16", 4)):
                for backward, _ in hopper_run.distinct_backwards(d, "ring ", ring_args[0]):
                    hopper_run.guarded(
                        f"ring {ring_args} D={d} {backward}", run_ring_check, *ring_args, backward, d
                    )
    seqs = [int(s) for s in args.seqs.split(",")]
    if "bench" in parts and not args.interpret:
        for h, kvh, d, shape_seqs in parse_shapes(args.shapes, seqs):
            for length in shape_seqs:
                for causal in [c == "1" for c in args.causal.split(",")]:
                    hopper_run.guarded(
                        f"bench L={length} {h}:{kvh}:{d} causal={causal}",
                        hopper_bench.bench,
                        length,
                        causal,
                        h,
                        kvh,
                        d,
                    )
    if "repeat" in parts and not args.interpret:
        for h, kvh, d, shape_seqs in parse_shapes(args.shapes, seqs):
            for causal in [c == "1" for c in args.causal.split(",")]:
                hopper_run.guarded(
                    f"repeat L={shape_seqs[0]} {h}:{kvh}:{d} causal={causal}",
                    hopper_bench.repeat,
                    shape_seqs[0],
                    causal,
                    h,
                    kvh,
                    d,
                )
    if "sweep" in parts and not args.interpret:
        hopper_run.guarded("sweep", hopper_bench.bench, seqs[0], True, 32, 32, 128, True)


def _parser() -> argparse.ArgumentParser:
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
        f"ms (at most {hopper_bench.MAX_REPS})",
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
        default=hopper_run.HARD_LIMIT_S,
        help="seconds after which the watchdog writes the output and exits",
    )
    return ap


def _configure(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Sets the run's module-level knobs (hopper_run, hopper_bench, INTERPRET) from the arguments
    and starts the watchdog."""
    hopper_run.BUDGET_S = args.hard_limit - (
        hopper_run.HARD_LIMIT_S - hopper_run.BUDGET_S
    )  # start nothing new near the limit
    hopper_run.BACKWARDS[:] = [b for b in args.backwards.split(",") if b]
    for spec in hopper_run.BACKWARDS:
        try:
            hopper_run.block_sizes(spec, 128)
        except (ValueError, TypeError) as e:
            ap.error(f"--backwards entry {spec!r}: {e} (names: {ph.BACKWARDS})")
    hopper_run.OUT["prefix"] = args.out
    args.shapes = args.shapes or f"32:32:{args.dim}"
    hopper_bench.REPS["n"], hopper_bench.REPS["min_ms"] = args.reps, args.min_ms
    hopper_bench.ROUNDS["n"] = args.rounds
    hopper_bench.CUDNN_DET["on"] = args.cudnn_deterministic
    INTERPRET["on"] = args.interpret
    threading.Thread(target=hopper_run.watchdog, args=(args.hard_limit,), daemon=True).start()


def main():
    ap = _parser()
    args = ap.parse_args()
    _configure(ap, args)
    parts = set(args.parts.split(","))
    if args.interpret and jax.device_count() < 2:
        hopper_run.log(
            "WARNING: --interpret with one CPU device may hang; set "
            "XLA_FLAGS=--xla_force_host_platform_device_count=8"
        )
    dev = jax.devices()[0]
    hopper_run.log(
        f"jax {jax.__version__}, {dev.device_kind}, compute capability "
        f"{getattr(dev, 'compute_capability', '?')}, pallas_hopper available: {ph.available()}, "
        f"auto -> {implementations.resolve('auto').name}, python {sys.version.split()[0]}"
    )
    try:
        run_parts(args, parts)
    finally:
        n_pass = sum(1 for r in hopper_run.RECORDS if r.get("passed") is True)
        n_fail = sum(1 for r in hopper_run.RECORDS if r.get("passed") is False)
        n_err = sum(1 for r in hopper_run.RECORDS if r.get("kind") in ("error", "time_error"))
        elapsed = time.perf_counter() - hopper_run.T0
        hopper_run.log(f"SUMMARY pass={n_pass} fail={n_fail} errors={n_err} elapsed={elapsed:.0f}s")


if __name__ == "__main__":
    main()
