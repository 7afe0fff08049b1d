"""What each attention option costs, and `check_vma`, against the plain ring in the same run.

On one device (a ring of one inside ``jax.shard_map``), ``implementation="auto"``: the plain causal
ring, then the same call with one option each (``sinks``, ``logits_soft_cap``, ``prefix_length``,
``bidirectional_segments``, a value head dim of 128 under a query/key head dim of 192) and the plain
ring under ``shard_map(check_vma=False)``, at each length of ``--seqs``. Every variant is first checked
against the float32 ``reference_attention`` on the device; every call is timed in ``--rounds``
interleaved rounds (each the median of ``--reps`` calls after a warm-up call; each round starts one
call further on) and its time is the median of its rounds, with cuDNN's causal attention (GPU,
forward and forward+backward) in the same rounds as the yardstick, and plain's calls timed twice
per round, so the table shows the noise of a ratio that should be 1.00x. "auto"
names the kernel each variant ran on (an option the fastest kernel lacks falls back to the next one
that has it).

  python benchmarks/options.py --seqs 32768,131072 --out benchmarks/results/options_h100
  python benchmarks/options.py --tiny          # CPU smoke test (auto is xla there)

FLOPs count the work each variant really does (:func:`visible_pairs`): forward 2 * B * H * pairs *
(Dqk + Dv), where ``pairs`` are the (query, key) pairs the mask lets through (causal L (L + 1) / 2; a
prefix adds the keys its queries see ahead of them; bidirectional segments are separate documents),
forward+backward 3.5x that (the FlashAttention convention), timed as one ``jax.vjp`` call: one forward
and one backward (as ``attention.py``; before 2026-12-07 the forward was timed twice, a forward call
plus the vjp, which understated forward+backward TFLOP/s). TFLOP/s are per device; a variant's
speed "vs plain" is its TFLOP/s over the plain ring's at the same length, the median over rounds of
each round's ratio (:func:`speeds`; issue 59's bar: 0.95x,
soft-capping 0.9x, head dims 192/128 0.9x of the plain head dim 128).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import attention as bench  # noqa: E402  (time_fn, baseline_fn)
from work_counts import git_commit  # noqa: E402

import ringattention as ra  # noqa: E402


def variants(seq: int) -> dict[str, dict]:
    """name -> ring_attention keywords (``qk_dim``: a query/key head dim of its own; ``check_vma``:
    the shard_map's)."""
    return {
        "plain": {},
        "sinks": dict(sinks=True),
        "softcap 50": dict(logits_soft_cap=50.0),
        "prefix L/4": dict(prefix_length=seq // 4),
        "bidirectional segments": dict(bidirectional_segments=True),
        "head dims 192/128": dict(qk_dim=192),
        "check_vma=False": dict(check_vma=False),
    }


AGAIN = "plain again"  # plain's calls timed a second time in each round (an A/A pair)

# The bar of issue 59 per variant: TFLOP/s over the plain ring's (the rest: TARGET_DEFAULT)
TARGETS = {"softcap 50": 0.9, "head dims 192/128": 0.9}
TARGET_DEFAULT = 0.95


def visible_pairs(opts: dict, seq: int) -> int:
    """(query, key) pairs the causal mask of variant ``opts`` lets through on ``seq`` tokens (one
    row): causal ``L (L + 1) / 2``; a prefix of P tokens adds ``P (P - 1) / 2`` (keys ahead of a
    query inside the prefix); ``_segments``' four documents (2nd and 4th bidirectional) see only
    themselves: ``2 n (n + 1) / 2 + 2 n * n`` with ``n = L / 4``."""
    if opts.get("bidirectional_segments"):
        n = seq // 4
        return n * (n + 1) + 2 * n * n
    pairs = seq * (seq + 1) // 2
    if "prefix_length" in opts:
        p = opts["prefix_length"]
        pairs += p * (p - 1) // 2
    return pairs


def variant_flops(opts: dict, seq: int, heads: int, v_dim: int, mode: str) -> float:
    """FLOPs of one forward ("fwd") or forward+backward ("fwdbwd") of the variant, batch 1."""
    qk = opts.get("qk_dim", v_dim)
    f = 2.0 * heads * visible_pairs(opts, seq) * (qk + v_dim)
    return f * (3.5 if mode == "fwdbwd" else 1.0)


def _inputs(args, seq: int, qk_dim: int):
    B, H, K, D = 1, args.heads, args.kv_heads, args.head_dim
    kq, kk, kv, kd = jax.random.split(jax.random.PRNGKey(0), 4)
    dt = jnp.dtype(args.dtype)
    return (
        jax.random.normal(kq, (B, seq, H, qk_dim), dt),  # q [B, L, H, Dqk]
        jax.random.normal(kk, (B, seq, K, qk_dim), dt),  # k [B, L, K, Dqk]
        jax.random.normal(kv, (B, seq, K, D), dt),  # v [B, L, K, D]
        jax.random.normal(kd, (B, seq, H, D), dt),
    )  # do [B, L, H, D]


def _segments(seq: int):
    """Four documents per row, the 2nd and 4th bidirectional (negative ids). int32 [1, L]."""
    ids = np.repeat(np.arange(1, 5), seq // 4)
    return jnp.asarray(np.where(ids % 2 == 0, -ids, ids)[None], jnp.int32)


def make_fns(opts: dict, seq: int, heads: int, mesh):
    """(the variant inside shard_map, the float32 reference) as functions of q, k, v."""
    kw = {o: x for o, x in opts.items() if o not in ("check_vma", "qk_dim", "sinks")}
    seg = _segments(seq) if opts.get("bidirectional_segments") else None
    if opts.get("sinks"):
        kw["sinks"] = jnp.linspace(-1.0, 1.0, heads, dtype=jnp.float32)
    if "prefix_length" in kw:  # the same fraction of the sequence at any length
        kw["prefix_length"] = jnp.full((1,), seq // 4, jnp.int32)
    spec = P(None, "sp")

    def local(q, k, v, s):
        return ra.ring_attention(q, k, v, "sp", causal=True, segment_ids=s, **kw)

    fn = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(spec, spec, spec, spec),
        out_specs=spec,
        check_vma=opts.get("check_vma", True),
    )
    ref = lambda q, k, v: ra.reference_attention(q, k, v, causal=True, segment_ids=seg, **kw)  # noqa: E731
    return (lambda q, k, v: fn(q, k, v, seg)), ref


def picked(opts: dict, seq: int, mesh) -> str:
    """The kernel "auto" runs the variant on."""
    names = {
        "logits_soft_cap": "softcap",
        "prefix_length": "prefix",
        "bidirectional_segments": "bidirectional",
        "qk_dim": "v_head_dim",
    }
    used = frozenset(f for o, f in names.items() if o in opts)
    return ra.implementations.resolve("auto", mesh, shard=seq, needs=used).name


def check(opts: dict, args, seq: int, mesh) -> float:
    """Max abs error against the float32 reference on ``check_len`` tokens, float32 inputs."""
    n = min(seq, args.check_len)
    q, k, v, _ = (x.astype(jnp.float32) for x in _inputs(args, n, opts.get("qk_dim", args.head_dim)))
    fn, ref = make_fns(opts, n, args.heads, mesh)
    return float(jnp.max(jnp.abs(jax.jit(fn)(q, k, v) - jax.jit(ref)(q, k, v))))


def _prepare(name: str, opts: dict, args, seq: int, mesh, inputs: dict) -> tuple[dict, dict]:
    """(the variant's row: kernel and error; {mode: (jitted call, its arguments)}), forward+backward
    as one ``jax.vjp`` call (one forward, one backward). ``inputs``: qk head dim -> (q, k, v, do),
    shared by the variants."""
    qk = opts.get("qk_dim", args.head_dim)
    if qk not in inputs:
        inputs[qk] = _inputs(args, seq, qk)
    q, k, v, do = inputs[qk]
    fn, _ = make_fns(opts, seq, args.heads, mesh)
    fb = lambda q, k, v, do, fn=fn: jax.vjp(fn, q, k, v)[1](do)  # noqa: E731
    row = dict(
        variant=name,
        seq=seq,
        implementation=picked(opts, seq, mesh),
        max_abs_err=check(opts, args, seq, mesh),
    )
    return row, {"fwd": (jax.jit(fn), (q, k, v)), "fwdbwd": (jax.jit(fb), (q, k, v, do))}


def _cudnn_calls(args, seq: int, inputs: dict) -> dict:
    """cuDNN's causal attention on the plain shapes: {mode: (jitted call, its arguments)}."""
    base, _ = bench.baseline_fn("gpu", True)
    q, k, v, do = inputs[args.head_dim]
    fb = lambda q, k, v, do: jax.vjp(base, q, k, v)[1](do)  # noqa: E731
    return {"fwd": (jax.jit(base), (q, k, v)), "fwdbwd": (jax.jit(fb), (q, k, v, do))}


def time_rounds(calls: dict, rounds: int, reps: int) -> dict:
    """{key: [ms per round]}: every call timed once per round (``reps`` calls, their median), the
    calls interleaved round by round so that a drift of the clock or the heat falls on all alike,
    and round r starting r calls further on (a call's speed depends on what ran just before it:
    the same kernels timed twice in a row ran 1-3% apart on an H100)."""
    out = {key: [] for key in calls}
    keys = list(calls)
    for r in range(rounds):
        start = r % len(keys)
        for key in keys[start:] + keys[:start]:
            fn, a = calls[key]
            out[key].append(1e3 * bench.time_fn(fn, a, reps=reps))
    return out


def run(args) -> list[dict]:
    mesh = Mesh(np.array(jax.devices()[:1]), ("sp",))
    gpu = jax.devices()[0].platform == "gpu"
    rows = []
    for seq in args.seqs:
        chosen = variants(seq)
        if args.variants:
            chosen = {n: chosen[n] for n in ["plain", *args.variants.split(",")] if n in chosen}
        inputs, calls, seq_rows = {}, {}, {}
        for name, opts in chosen.items():
            seq_rows[name], fns = _prepare(name, opts, args, seq, mesh, inputs)
            calls.update({(name, mode): fn for mode, fn in fns.items()})
        if gpu:  # the yardstick, same run
            calls.update({("cudnn", m): fn for m, fn in _cudnn_calls(args, seq, inputs).items()})
        # plain's calls once more, elsewhere in each round: the noise of a ratio that should be 1
        calls.update({(AGAIN, m): calls[("plain", m)] for m in ("fwd", "fwdbwd")})
        times = time_rounds(calls, args.rounds, args.reps)
        for (name, mode), ms in times.items():
            row = seq_rows["plain"] if name in ("cudnn", AGAIN) else seq_rows[name]
            key = {"cudnn": f"cudnn_{mode}", AGAIN: f"again_{mode}"}.get(name, mode)
            row[f"{key}_ms"], row[f"{key}_ms_rounds"] = float(np.median(ms)), ms
        for name, row in seq_rows.items():
            speeds(row, seq_rows["plain"], chosen[name], args)
            row["target"] = TARGETS.get(name, TARGET_DEFAULT)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def speeds(row: dict, plain: dict, opts: dict, args) -> None:
    """A timed row's TFLOP/s (its median round) and its speed over the plain ring's: the median
    over rounds of that round's ratio, each round's two calls timed moments apart, so that a drift
    of the clock between rounds (the GPU's falls as it warms) cancels."""
    for mode in ("fwd", "fwdbwd"):
        flops = variant_flops(opts, row["seq"], args.heads, args.head_dim, mode)
        base = variant_flops({}, row["seq"], args.heads, args.head_dim, mode)
        row[f"{mode}_tflops"] = flops / (row[f"{mode}_ms"] * 1e-3) / 1e12
        ours, theirs = row[f"{mode}_ms_rounds"], plain[f"{mode}_ms_rounds"]
        row[f"{mode}_vs_plain"] = float(np.median([flops / base * p / t for p, t in zip(theirs, ours)]))
        for other in ("cudnn", "again"):  # cuDNN's time over ours, plain's over plain's again
            if f"{other}_{mode}_ms_rounds" in row:
                them = row[f"{other}_{mode}_ms_rounds"]
                row[f"{other}_{mode}_vs_ours"] = float(np.median([c / t for c, t in zip(them, ours)]))


def table(rows: list[dict]) -> str:
    lines = [
        "| tokens | variant | auto ran | fwd / fwd+bwd TFLOP/s | vs plain (fwd / fwd+bwd) | "
        "bar | max abs err |",
        "|---:|---|---|---|---|---|---|",
    ]
    for r in rows:
        ok = min(r["fwd_vs_plain"], r["fwdbwd_vs_plain"]) >= r["target"]
        lines.append(
            f"| {r['seq'] // 1024}K | {r['variant']} | {r['implementation']} | "
            f"{r['fwd_tflops']:.0f} / {r['fwdbwd_tflops']:.0f} | {r['fwd_vs_plain']:.2f}x / "
            f"{r['fwdbwd_vs_plain']:.2f}x | {r['target']:.2f}x {'met' if ok else 'MISSED'} | "
            f"{r['max_abs_err']:.1e} |"
        )
    for r in rows:
        if "again_fwd_vs_ours" in r:
            lines.append(
                f"\nPlain against itself at {r['seq'] // 1024}K (its calls timed twice in each round, "
                f"a ratio that would be 1.00x without noise): forward {r['again_fwd_vs_ours']:.2f}x, "
                f"forward+backward {r['again_fwdbwd_vs_ours']:.2f}x."
            )
        if "cudnn_fwd_vs_ours" in r:
            lines.append(
                f"\nPlain ring against cuDNN at {r['seq'] // 1024}K: forward "
                f"{r['cudnn_fwd_vs_ours']:.2f}x, forward+backward "
                f"{r['cudnn_fwdbwd_vs_ours']:.2f}x (cuDNN time / ours, the median of the rounds)."
            )
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", default="32768,131072", help="comma-separated lengths, one run")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv_heads", type=int, default=8)
    p.add_argument("--head_dim", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--reps", type=int, default=10, help="calls per timing (their median)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timings of every call (median)")
    p.add_argument("--check_len", type=int, default=2048)
    p.add_argument(
        "--variants", default="", help="comma-separated names (default: all); plain always runs first"
    )
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: 256 tokens, 4:2 heads, 32")
    p.add_argument("--out", default=None, help="prefix of the .json/.md to write")
    p.add_argument("--commit", default=None, help="the commit measured (default: git's HEAD)")
    p.add_argument("--render", default=None, help="a result .json: recompute its speeds and table")
    args = p.parse_args(argv)
    if args.render:
        return render(json.loads(pathlib.Path(args.render).read_text()), args.out)
    args.seqs = [int(x) for x in args.seqs.split(",")]
    if args.tiny:
        args.seqs, args.heads, args.kv_heads, args.head_dim = [256], 4, 2, 32
        args.dtype, args.reps, args.rounds, args.check_len = "float32", 1, 1, 128
    rows = run(args)
    meta = dict(
        date=datetime.date.today().isoformat(),
        commit=args.commit or git_commit(),
        device=jax.devices()[0].device_kind,
        jax=jax.__version__,
        seqs=args.seqs,
        heads=args.heads,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        dtype=args.dtype,
        reps=args.reps,
        rounds=args.rounds,
    )
    return write(dict(meta=meta, rows=rows), args.out)


def render(result: dict, out: str | None) -> dict:
    """A written result again from its timed rounds (``--render``): speeds by :func:`speeds`."""
    shape = argparse.Namespace(**{k: result["meta"][k] for k in ("heads", "head_dim")})
    for seq in result["meta"]["seqs"]:
        rows = [r for r in result["rows"] if r["seq"] == seq]
        plain = next(r for r in rows if r["variant"] == "plain")
        for r in rows:
            speeds(r, plain, variants(seq)[r["variant"]], shape)
    return write(result, out)


def write(result: dict, out: str | None) -> dict:
    """Prints the table; with ``out``, writes ``out``.json and ``out``.md (``meta["note"]``, where
    given, as a paragraph under the header)."""
    md = table(result["rows"])
    print(md)
    if out:
        meta = dict(result["meta"])
        note = f"{meta.pop('note')}\n\n" if "note" in meta else ""
        head = " ".join(f"{k}={v}" for k, v in meta.items())
        pathlib.Path(out + ".json").write_text(json.dumps(result, indent=1))
        pathlib.Path(out + ".md").write_text(
            f"# Attention options against the plain ring\n\n{head}\n\n{note}{md}\n"
        )
    return result


if __name__ == "__main__":
    main()
