"""Bytes sent per device per layer by ring, all-gather, Ulysses and Ulysses x ring attention, from HLO.

Context parallelism over P devices: a ring of P (Ring Attention, Liu et al. 2023), one
Ulysses group of P (DeepSpeed-Ulysses, Jacobs et al. 2023; needs heads % P == 0) and the 2-D hybrid,
Ulysses groups of U inside a ring of P / U (USP, Fang & Zhao 2024; ``ringattention.ulysses``), and
(``--schemes all_gather``, in ``--tiny`` by default) the all-gather of k/v over P devices (Llama 3
context parallelism, Dubey et al. 2024; ``ringattention.all_gather``). For each, the attention of
one layer (causal, batch 1) is compiled (never run) on P virtual CPU devices,
forward and forward+backward, and the optimized HLO's collectives are summed per device: every
``collective-permute`` sends its operand, every ``all-to-all`` over a group of g sends (g - 1) / g of
it, every ``all-gather`` (g - 1) / g of its result, every ``reduce-scatter`` g - 1 times its result;
ops inside loops count once per iteration (XLA's ``known_trip_count``). The same numbers follow
from the algorithm (:func:`analytic`); the table shows both and whether they agree.

XLA's CPU compiler widens bfloat16 collectives to float32, so the HLO is measured with float32
inputs; the bfloat16 columns (what a GPU run sends) come from the analytic formula that the float32
HLO confirms (inputs, outputs and k/v at the input dtype; the ring's travelling dk/dv accumulators
in float32 either way). Bytes are linear in the sequence length: the HLO is measured where
``--measure`` says (default: 128K at every P, 1M at 64) and the formula gives the rest.

    python benchmarks/cp_bytes.py           # 1B and 8B attention shapes, 128K..1M, 8..64 devices
    python benchmarks/cp_bytes.py --tiny    # CPU smoke test (4 and 8 devices, tiny shapes)

Writes benchmarks/results/cp_bytes.json and cp_bytes.md (``--out`` for another prefix).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="1b,8b", help="presets whose attention shapes to use")
    p.add_argument("--seqs", default="131072,262144,524288,1048576")
    p.add_argument("--devices", default="8,16,32,64")
    p.add_argument("--node", type=int, default=8, help="the hybrid's Ulysses group (<= P / 2)")
    p.add_argument(
        "--measure",
        default="131072,1048576@64",
        help="where the HLO is compiled: lengths (every P) or length@P (others: formula)",
    )
    p.add_argument("--schemes", default="ring,ulysses,hybrid")
    p.add_argument("--chunk", type=int, default=4096, help="ring inner-loop block (compile only)")
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny shapes, 4-8 devices")
    p.add_argument("--out", default=None, help="output prefix (default benchmarks/results/cp_bytes)")
    p.add_argument("--from-json", default=None, help="only re-render the markdown of a saved run")
    args = p.parse_args(argv)
    if args.tiny:  # smoke-test values for every option left at its default
        tiny = dict(
            models="tiny",
            seqs="256,512",
            devices="4,8",
            node=4,
            measure="256",
            chunk=16,
            schemes="ring,all_gather,ulysses,hybrid",
        )
        for k, v in tiny.items():
            if getattr(args, k) == p.get_default(k):
                setattr(args, k, v)
    return args


def measured(args, seq: int, p: int) -> bool:
    """Whether ``--measure`` asks for the HLO at this length and device count."""
    for item in args.measure.split(","):
        at = item.split("@")
        if item and int(at[0]) == seq and (len(at) == 1 or int(at[1]) == p):
            return True
    return False


def _max_devices(argv) -> int:
    return max(int(d) for d in parse_args(argv).devices.split(","))


if __name__ == "__main__":  # before jax starts: enough virtual CPU devices for the largest mesh
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_"
        f"device_count={_max_devices(sys.argv[1:])}"
    ).strip()
    os.environ["JAX_PLATFORMS"] = "cpu"
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from hlo_collectives import COLLECTIVES, hlo_collective_bytes  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from ringattention import BlockSizes, ring_attention, ulysses  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
MIB = 2**20
TINY = (8, 2, 16)  # heads, kv heads, head dim of the smoke test
ACC_BYTES = 4  # the ring's dk/dv accumulators travel in float32


# ---- the formula ---------------------------------------------------------------------------------


def analytic(
    heads: int, kv_heads: int, dim: int, seq: int, u: int, n: int, dtype_bytes: int, gather: bool = False
) -> dict:
    """Bytes one device sends for one layer's attention (see the module doc).

    Returns {"fwd": {kind: bytes}, "fwd_bwd": {kind: bytes}} with kinds "all-to-all" (the Ulysses
    exchange, within a group) and "collective-permute" (the ring). Forward: the exchange sends
    (u-1)/u of q, k, v (kv heads repeated to K') and of the output o; the ring sends its k, v shard
    (u s tokens, K'/u heads) n - 1 times. Forward+backward: q, k, v and the ring's forward lap; then
    the output gradient's exchange, the backward lap and the exchange of dq, dk, dv back. The
    backward lap sends k, v n - 2 times (its first hop is the forward lap's first hop, the same op on
    the same shard, which XLA computes once) and the float32 dk, dv n times (the last hop takes them
    home). The output itself is not exchanged back in a program that only returns gradients.
    ``gather`` (the all-gather strategy, u = 1): the forward gathers k, v ((n - 1) / n of the
    gathered n shards); the backward's gathers of the same pieces are the same ops, which XLA
    computes once, and it reduce-scatters the float32 dk, dv (``ringattention.strategy.bytes_sent``).
    """
    s = seq // (u * n)  # this device's piece
    kr = kv_heads * (ulysses.kv_repeats(heads, kv_heads, u) if u > 1 else 1)
    a2a, b = (u - 1) / u, dtype_bytes
    hop = 2 * s * kr * dim  # elements of one k, v (or dk, dv) ring shard: u s tokens, kr / u heads
    qkv = a2a * s * dim * (heads + 2 * kr) * b
    o = a2a * s * dim * heads * b  # the output (forward) or its gradient (backward)
    if gather:
        if u != 1:
            raise ValueError(f"the all-gather scheme runs without Ulysses; got {u=}")
        return {
            "fwd": {"all-gather": (n - 1) * hop * b},
            "fwd_bwd": {"all-gather": (n - 1) * hop * b, "reduce-scatter": (n - 1) * hop * ACC_BYTES},
        }
    fwd_lap = (n - 1) * hop * b
    bwd_lap = (max(n - 2, 0) * hop * b + n * hop * ACC_BYTES) if n > 1 else 0
    return {
        "fwd": {"all-to-all": qkv + o, "collective-permute": fwd_lap},
        "fwd_bwd": {"all-to-all": qkv + o + qkv, "collective-permute": fwd_lap + bwd_lap},
    }


def total(parts: dict) -> float:
    return float(sum(parts.values()))


# ---- compiling one scheme -----------------------------------------------------------------------


def compile_text(heads, kv_heads, dim, seq, u, n, grad: bool, chunk: int, strategy: str = "ring") -> str:
    """Optimized HLO of one layer's causal attention on a (ring n) x (Ulysses u) mesh, float32."""
    mesh = Mesh(np.array(jax.devices()[: u * n]).reshape(n, u), ("sp", "usp"))
    spec = P(None, ("sp", "usp"))
    block = min(chunk, seq // n)
    attn = lambda q, k, v: ring_attention(  # noqa: E731
        q,
        k,
        v,
        "sp",
        causal=True,
        implementation="xla",
        block_sizes=BlockSizes(block, block),
        ulysses_axis="usp" if u > 1 else None,
        strategy=strategy,
    )
    f = sharded = jax.shard_map(attn, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    if grad:
        f = jax.grad(lambda q, k, v: sharded(q, k, v).sum(), argnums=(0, 1, 2))
    q = jax.ShapeDtypeStruct((1, seq, heads, dim), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, seq, kv_heads, dim), jnp.float32)
    return jax.jit(f).lower(q, kv, kv).compile().as_text()


def schemes(p: int, heads: int, node: int) -> list[tuple[str, int, int, str | None]]:
    """(name, ulysses u, ring n, why not) of the three schemes on p devices."""
    hu = min(node, p // 2)
    return [
        ("ring", 1, p, None),
        ("all_gather", 1, p, None),
        ("ulysses", p, 1, None if heads % p == 0 else f"{heads} heads < {p} devices"),
        (f"hybrid {hu}x{p // hu}", hu, p // hu, None if heads % hu == 0 else "heads"),
    ]


def shapes(model: str) -> tuple[int, int, int]:
    if model == "tiny":
        return TINY
    from models.config import get_config

    c = get_config(model)
    return c.num_heads, c.num_kv_heads, c.head_dim


def measure_row(model, seq, p, scheme, args, measure: bool) -> dict:
    name, u, n, why = scheme
    heads, kv_heads, dim = shapes(model)
    row = {
        "model": model,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": dim,
        "seq": seq,
        "devices": p,
        "scheme": name,
        "ulysses": u,
        "ring": n,
    }
    if why:
        return {**row, "skipped": why}
    gather = name == "all_gather"
    row["bf16"] = analytic(heads, kv_heads, dim, seq, u, n, 2, gather)
    row["f32"] = analytic(heads, kv_heads, dim, seq, u, n, 4, gather)
    if measure:
        t = time.perf_counter()
        row["hlo_f32"] = {}
        for key, grad in (("fwd", False), ("fwd_bwd", True)):
            got = hlo_collective_bytes(
                compile_text(
                    heads, kv_heads, dim, seq, u, n, grad, args.chunk, "all_gather" if gather else "ring"
                )
            )
            row["hlo_f32"][key] = got
        row["compile_s"] = round(time.perf_counter() - t, 1)
        row["hlo_matches"] = all(  # each kind on its own; nothing else is sent
            math.isclose(
                row["hlo_f32"][k].get(kind, 0.0), row["f32"][k].get(kind, 0.0), rel_tol=1e-9, abs_tol=0.5
            )
            for k in ("fwd", "fwd_bwd")
            for kind in COLLECTIVES
        )
    return row


# ---- the table -----------------------------------------------------------------------------------


def _tokens(seq: int) -> str:
    return f"{seq // 1024}K" if seq % 1024 == 0 else str(seq)


def _mib(x: float) -> str:
    if x == 0:
        return "0"
    return f"{x / MIB:,.0f}" if x >= 10 * MIB else f"{x / MIB:,.2f}"


_SHORT = {
    "all-to-all": "a2a",
    "collective-permute": "permute",
    "all-gather": "gather",
    "reduce-scatter": "scatter",
}


def _head(result: dict) -> str:
    cmd = " ".join(["python benchmarks/cp_bytes.py", result["argv"]]).strip()
    return (
        f"Bytes sent per device for one layer's causal attention (MiB, batch 1, bfloat16 q/k/v), "
        f"ring vs Ulysses vs Ulysses x ring; {result['date']}, jax {result['jax']}, `{cmd}`. "
        "Shapes (heads, kv heads, head dim): "
        + ", ".join(f"{m} {shapes(m)}" for m in result["models"])
        + ". Hybrid U x N = Ulysses "
        f"groups of U = min({result['node']}, P / 2) inside a ring of N = P / U. Ulysses needs "
        "heads % P == 0; kv heads are repeated to a multiple of the Ulysses size. From the "
        "formula of `analytic()`, which the compiled HLO confirms below. Bytes are not time: "
        "the ring hides its permutes behind the compute of each step, the all-to-all runs "
        "between the layer's projections and attention."
    )


def _totals(rows: list, names: list) -> list[str]:
    """Per (model, tokens, P): the bfloat16 total of each scheme, forward and forward+backward."""
    lines = [
        "| model | tokens | P | "
        + " | ".join(f"fwd {n}" for n in names)
        + " | "
        + " | ".join(f"fwd+bwd {n}" for n in names)
        + " |",
        "|---" * (3 + 2 * len(names)) + "|",
    ]
    keys = list(dict.fromkeys((r["model"], r["seq"], r["devices"]) for r in rows))
    for model, seq, p in keys:
        hit = {
            r["scheme"].split()[0]: r for r in rows if (r["model"], r["seq"], r["devices"]) == (model, seq, p)
        }
        cells = []
        for key in ("fwd", "fwd_bwd"):
            for n in names:
                r = hit.get(n)
                cells.append("n/a" if r is None or "skipped" in r else _mib(total(r["bf16"][key])))
        lines.append(f"| {model} | {_tokens(seq)} | {p} | " + " | ".join(cells) + " |")
    return lines


def _by_kind(rows: list, kinds: list) -> list[str]:
    """At the largest length: each scheme's bfloat16 bytes by collective kind."""
    lines = [
        "| model | P | scheme | "
        + " | ".join(
            f"{k} {kind if kind == 'all-to-all' else _SHORT[kind]}"
            for k in ("fwd", "fwd+bwd")
            for kind in kinds
        )
        + " |",
        "|---" * (3 + 2 * len(kinds)) + "|",
    ]
    longest = max(r["seq"] for r in rows)
    for r in rows:
        if r["seq"] == longest and "skipped" not in r:
            cells = [_mib(r["bf16"][k].get(kind, 0.0)) for k in ("fwd", "fwd_bwd") for kind in kinds]
            lines.append(f"| {r['model']} | {r['devices']} | {r['scheme']} | " + " | ".join(cells) + " |")
    return lines


def _hlo_check(rows: list, kinds: list) -> list[str]:
    """Each measured row's float32 HLO bytes by kind against the formula's."""
    lines = [
        "| model | tokens | P | scheme | "
        + " | ".join(f"{k} {_SHORT[kind]} HLO / formula" for k in ("fwd", "fwd+bwd") for kind in kinds)
        + " | match | compile s |",
        "|---" * (6 + 2 * len(kinds)) + "|",
    ]
    for r in rows:
        if "hlo_f32" not in r:
            continue
        cells = [
            f"{_mib(r['hlo_f32'][k].get(kind, 0.0))} / {_mib(r['f32'][k].get(kind, 0.0))}"
            for k in ("fwd", "fwd_bwd")
            for kind in kinds
        ]
        lines.append(
            f"| {r['model']} | {_tokens(r['seq'])} | {r['devices']} | {r['scheme']} | "
            + " | ".join(cells)
            + f" | {'yes' if r['hlo_matches'] else 'NO'} | {r['compile_s']} |"
        )
    return lines


def markdown(result: dict) -> str:
    rows = result["rows"]
    present = {r["scheme"].split()[0] for r in rows}
    names = [n for n in ("ring", "all_gather", "ulysses", "hybrid") if n in present or n != "all_gather"]
    kinds = ["all-to-all", "collective-permute"] + (
        ["all-gather", "reduce-scatter"] if "all_gather" in present else []
    )
    by_kind = (
        "Split by kind at the largest length, bfloat16 (formula): the Ulysses all-to-all "
        "stays within a group (a host), the ring's collective-permutes cross groups."
    )
    hlo = (
        "HLO check (float32 inputs, the CPU compiler's dtype): bytes of the optimized HLO's "
        "collective-permute and all-to-all ops (loop bodies times their trip counts) against "
        "the formula at 4 bytes per element, each kind on its own; no other collective "
        "appears."
    )
    lines = [_head(result), "", *_totals(rows, names), "", by_kind, "", *_by_kind(rows, kinds)]
    lines += ["", hlo, "", *_hlo_check(rows, kinds)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            result = json.load(f)
        with open((args.out or os.path.splitext(args.from_json)[0]) + ".md", "w") as f:
            f.write(markdown(result))
        return result
    devices = [int(d) for d in args.devices.split(",")]
    if max(devices) > jax.device_count():
        raise ValueError(
            f"--devices {args.devices} needs {max(devices)} devices; jax has "
            f"{jax.device_count()} (run this file as a script: it sets XLA_FLAGS)"
        )
    models = args.models.split(",")
    rows = []
    for model in models:
        for seq in [int(s) for s in args.seqs.split(",")]:
            for p in devices:
                for scheme in schemes(p, shapes(model)[0], args.node):
                    if scheme[0].split()[0] not in args.schemes.split(","):
                        continue
                    row = measure_row(model, seq, p, scheme, args, measured(args, seq, p))
                    print(json.dumps({k: v for k, v in row.items() if k != "hlo_f32"}), flush=True)
                    rows.append(row)
    result = {
        "date": datetime.date.today().isoformat(),
        "jax": jax.__version__,
        "argv": " ".join(argv if argv is not None else sys.argv[1:]),
        "models": models,
        "node": args.node,
        "rows": rows,
    }
    prefix = args.out or os.path.join(RESULTS, "cp_bytes")
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    with open(prefix + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(prefix + ".md", "w") as f:
        f.write(markdown(result))
    bad = [r for r in rows if r.get("hlo_matches") is False]
    if bad:
        raise SystemExit(f"HLO bytes differ from the formula in {len(bad)} rows (see {prefix}.md)")
    return result


if __name__ == "__main__":
    main()
