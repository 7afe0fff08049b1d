"""One call of the Hopper ring step and of cuDNN's attention, for Nsight Compute to profile.

``hopper_check.py`` times kernels; this script gives a profiler one launch of each, so that their
hardware counters (DRAM and L2 traffic, tensor-pipe use, warp stalls) can be read side by side:
the ``pallas_hopper`` forward and backward step with the default block sizes (or ``--backward``, a
``hopper_check.py --backwards`` entry such as ``default/bwd_stages=3``),
then cuDNN's forward and its gradient, at batch 1, bf16, ``--shape`` heads:kv_heads:head_dim and
``--seq`` tokens. Inputs are made on the host, so the only kernels are those of the four calls
(in that order; XLA's small fusions around them too). On an H100/H200 with ``ncu``:

  XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS=--xla_gpu_enable_command_buffer= \\
  ncu --clock-control none --set full -f --launch-count 8 \\
      --kernel-name regex:"mosaic|sdpa|cudnn|fmha|flash" --export $OUT/prof \\
      python3 tools/hopper_profile.py --shape 32:8:128 --seq 65536 --causal 0
  ncu --import $OUT/prof.ncu-rep --page details --csv > prof.csv
  python3 tools/hopper_profile.py --summarize prof.csv
  ncu --import $OUT/prof.ncu-rep --page raw --csv > raw.csv
  python3 tools/hopper_profile.py --pipes raw.csv   # tensor, MUFU (xu), FMA, ... busy per kernel

Where the warps wait, instruction by instruction: profile one kernel with ``--section
SourceCounters --launch-count 1 --kernel-name regex:scoped_mosaic`` (the backward; with
``--import-source yes`` ncu segfaulted on the H200, jax 0.11.2, 2026-12-02), then

  ncu --import $OUT/prof.ncu-rep --page source --print-source sass --csv > sass.csv
  python3 tools/hopper_profile.py --sass sass.csv   # ends with the hot loop's cycles per opcode

The soft cap's stalls beside plain's (issue #59: its forward runs 0.88-0.89x of plain's; fewer
MUFU operations, FA4's software exp2, bought nothing, and FA3's overlap on top of the ping-pong
lost: docs/kernels.md): ``--softcap 50
--causal 1`` adds the soft-capped forward and backward after the plain ones (two launches more:
``--launch-count 10``), and ``--summarize`` puts their columns side by side. Under the kernel
filter the capped forward is launch 2 (plain's forward and backward first, cuDNN's after):
``--launch-skip 2 --launch-count 1`` gives its source counters alone, and ``ncu --import`` takes
the same two flags to pick one kernel of a report for ``--page source``. Measured so (H100,
2026-12-07): the capped forward's MUFU pipe 61.8% busy against plain's 37.6%, its tensor pipe
60.8% against 72.8%, each MUFU instruction about 7 warp cycles (docs/kernels.md).

Every kernel's duration (XLA's fusions around the steps too): ``--section SpeedOfLight`` without
``--kernel-name``, XLA's autotuning off (``--xla_gpu_autotune_level=0``) so that no launch goes to
it, then ``--durations`` of the details CSV.

Registers and spills per kernel, without a profiler: run the script (any ``--seq``, 1024 is enough)
with ``MOSAIC_GPU_DUMP_PTXAS=1`` (``MOSAIC_GPU_DUMP_SASS=1`` adds the SASS where ``nvdisasm`` is
installed; the H200 machine has none) and its output in a file, then ``--ptxas`` that file.

``--clock-control none`` leaves the clocks alone; ncu replays each kernel once per pass
and restores its memory in between, so the backward's in-place dq accumulator is profiled as one
launch. Without the kernel filter the launches are spent on XLA's autotuning kernels; with jax's
default preallocation of GPU memory ncu fails on the first kernel it profiles. ``--summarize``
prints the metrics that compare the kernels (time, issue rate, spills, cache and DRAM traffic) and
ncu's estimated speedups, one column per kernel. ``--interpret`` runs the Pallas calls on CPU in
Mosaic GPU's interpret mode (cuDNN is left out): a dry run of the script itself. Results:
``docs/kernels.md``.
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import re
import sys

import hopper_run  # beside this script: hopper_check.py's --backwards entries
import jax
import jax.numpy as jnp
import numpy as np

from ringattention.kernels.hopper import pallas_hopper as ph


def parse_shape(spec: str) -> tuple[int, int, int]:
    """'heads:kv_heads:head_dim' -> ints; kv_heads must divide heads."""
    try:
        h, kvh, d = (int(x) for x in spec.split(":"))
    except ValueError:
        raise ValueError(f"--shape {spec!r}: expected heads:kv_heads:head_dim, e.g. 32:8:128") from None
    if min(h, kvh, d) < 1 or h % kvh:
        raise ValueError(f"--shape {spec!r}: heads={h} must be a positive multiple of kv_heads={kvh}")
    return h, kvh, d


def inputs(seq: int, h: int, kvh: int, d: int, seed: int = 0):
    """q, k, v, do (bf16, batch 1) made with numpy, placed on the device without a kernel."""
    rng = np.random.default_rng(seed)
    make = lambda heads: jnp.asarray(  # noqa: E731
        rng.standard_normal((1, seq, heads, d), np.float32), jnp.bfloat16
    )
    return make(h), make(kvh), make(kvh), make(h)


def pallas_fns(causal: bool, bs: ph.BlockSizes, interpret: bool, softcap: float | None = None):
    """(forward, backward) of the bare ring step (logits soft-capped at ``softcap`` where given);
    the backward takes the forward's o and lse."""
    kw = dict(causal=causal, block_sizes=bs, interpret=interpret, softcap=softcap)

    @jax.jit
    def fwd(q, k, v):
        pos = jnp.arange(q.shape[1], dtype=jnp.int32)
        return ph.forward_step(q, k, v, pos, pos, None, None, softmax_scale=q.shape[-1] ** -0.5, **kw)

    @jax.jit
    def bwd(q, k, v, do, o, lse):
        pos = jnp.arange(q.shape[1], dtype=jnp.int32)
        delta = jnp.einsum("bshd,bshd->bhs", o, do.astype(jnp.float32))
        return ph.backward_step(
            q, k, v, do, lse, delta, pos, pos, None, None, softmax_scale=q.shape[-1] ** -0.5, **kw
        )

    return fwd, bwd


def cudnn_fns(causal: bool):
    def fwd(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")

    def loss(q, k, v, do):
        return jnp.sum(fwd(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))

    return jax.jit(fwd), jax.jit(jax.grad(loss, (0, 1, 2)))


def block_sizes(head_dim: int, backward: str, causal: bool = True) -> ph.BlockSizes:
    """The block sizes of ``--backward`` at ``head_dim`` (``causal`` or not): a ``hopper_check.py
    --backwards`` entry, "name[/field=value...]" ("default" keeps the default's backward,
    "deterministic" is what ``deterministic=True`` runs; e.g. "default/bwd_stages=3")."""
    name = backward.split("/")[0]
    if name not in ("default", "deterministic", *ph.BACKWARDS):
        raise ValueError(
            f"--backward {backward!r}: must start with 'default', 'deterministic' or "
            f"one of {ph.BACKWARDS}, then optional /field=value entries"
        )
    return hopper_run.block_sizes(backward, head_dim, causal)


def _open_text(path: str, **kw):
    """A text file, plain or gzipped (ncu's CSVs and logs are often kept as .gz)."""
    return (gzip.open if path.endswith(".gz") else open)(path, "rt", **kw)


SUMMARY_METRICS = (  # ncu "details" page metric names, in the order printed
    "Duration",
    "Elapsed Cycles",
    "SM Frequency",
    "Waves Per SM",
    "Registers Per Thread",
    "Dynamic Shared Memory Per Block",
    "Executed Ipc Active",
    "Issue Slots Busy",
    "Warp Cycles Per Issued Instruction",
    "Local Memory Spilling Requests",
    "L1/TEX Cache Throughput",
    "L2 Cache Throughput",
    "L2 Hit Rate",
    "DRAM Throughput",
)


def summarize(path: str, rules: int = 4) -> str:
    """A table of ``SUMMARY_METRICS`` (one column per profiled kernel) from ncu's details page as
    CSV (plain or .gz), then per kernel its pipe-utilization note and the ``rules`` rules with the
    largest estimated speedup."""
    with _open_text(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("ID", "").isdigit()]
    if not rows:
        raise ValueError(f"--summarize {path!r}: no kernel rows (expected ncu --page details --csv)")
    metrics, notes = collections.defaultdict(dict), collections.defaultdict(list)
    names = {}
    for r in rows:
        names[r["ID"]] = f"{r['ID']}:{r['Kernel Name'][:22]}"
        if r["Metric Name"]:
            metrics[r["ID"]][r["Metric Name"]] = f"{r['Metric Value']} {r['Metric Unit']}".strip()
        elif r["Rule Name"] == "HighPipeUtilization" or r["Estimated Speedup"]:
            speedup = float(r["Estimated Speedup"] or "inf")
            notes[r["ID"]].append((speedup, r["Rule Name"], " ".join(r["Rule Description"].split())))
    ids = list(names)
    lines = [f"{'metric':36s}" + "".join(f"{names[i]:>28s}" for i in ids)]
    for m in SUMMARY_METRICS:
        lines.append(f"{m:36s}" + "".join(f"{metrics[i].get(m, '-'):>28s}" for i in ids))
    for i in ids:
        lines.append(f"\n{names[i]}")
        for speedup, rule, text in sorted(notes[i], reverse=True)[: rules + 1]:
            lines.append(f"  {rule} ({'-' if speedup == float('inf') else f'{speedup:.1f}%'}): {text[:240]}")
    return "\n".join(lines)


_MICROSECONDS = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6}


def durations(path: str) -> list[dict]:
    """Each profiled kernel's ID, name, grid and ``Duration`` in microseconds, in launch order, from
    ncu's details page as CSV (plain or .gz): where a step's time goes kernel by kernel, e.g. the
    main kernels against XLA's fusions around them (any section set that has Duration, such as
    ``--section SpeedOfLight`` without a kernel filter)."""
    with _open_text(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("ID", "").isdigit()]
    out = []
    for r in rows:
        if r["Metric Name"] != "Duration":
            continue
        unit = r["Metric Unit"].strip().lower()
        if unit not in _MICROSECONDS:
            raise ValueError(
                f"--durations {path!r}: kernel {r['ID']} Duration unit {unit!r} is not "
                f"one of {sorted(_MICROSECONDS)}"
            )
        us = _number(r["Metric Value"]) * _MICROSECONDS[unit]
        out.append(dict(id=int(r["ID"]), kernel=r["Kernel Name"], grid=r.get("Grid Size", ""), us=us))
    if not out:
        raise ValueError(f"--durations {path!r}: no Duration rows (expected ncu --page details --csv)")
    return out


def durations_table(kernels: list[dict]) -> str:
    """``durations`` as lines (ID, microseconds, grid, name) and their total."""
    lines = [f"{k['id']:>4} {k['us']:12.1f} us  {k['grid']:>16s}  {k['kernel'][:70]}" for k in kernels]
    return "\n".join([*lines, f"total {sum(k['us'] for k in kernels):12.1f} us"])


PIPES = {  # ncu raw-page metric per pipe: busy share of the elapsed cycles, in percent
    "tensor": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "xu (MUFU)": "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_elapsed",
    "fma": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "alu": "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "uniform": "sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_elapsed",
    "lsu": "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_elapsed",
}


def pipes(path: str) -> str:
    """How busy each pipe was, per profiled kernel (one line each), from ncu's raw page as CSV
    (``--page raw --csv``, plain or .gz: a header row, a units row, then one row per kernel;
    ``--set full`` collects these): e.g. a soft-capped forward's MUFU (xu) pipe against its
    tensor pipe, beside the plain forward's."""
    with _open_text(path, newline="") as f:
        head, _units, *rows = csv.reader(f)
    col = {name: i for i, name in enumerate(head)}
    missing = [m for m in ("ID", "Kernel Name", *PIPES.values()) if m not in col]
    if missing:
        raise ValueError(
            f"--pipes {path!r}: no {missing} column (expected ncu --page raw --csv of --set full)"
        )
    lines = [f"{'kernel':28s}" + "".join(f"{name:>11s}" for name in PIPES)]
    for r in rows:
        name = f"{r[col['ID']]}:{r[col['Kernel Name']][:25]}"
        lines.append(f"{name:28s}" + "".join(f"{_number(r[col[m]]):10.1f}%" for m in PIPES.values()))
    return "\n".join(lines)


SAMPLES = "Warp Stall Sampling (All Samples)"


def _number(text: str) -> float:
    return float(text.replace(",", "") or 0)


def sass_summary(path: str, top: int = 30) -> str:
    """Where a kernel's warps wait, from ncu's source page as CSV (``--page source --print-source
    sass --csv``, plain or .gz; ncu writes a "Kernel Name" line before the header): the share of
    the stall samples per opcode and per stall reason, then the ``top`` instructions with the most
    samples, with how often each ran (a spin-wait loop runs a handful of instructions many times;
    the producer's waits count as samples too)."""
    with _open_text(path, newline="") as f:
        lines = f.read().splitlines()
    start = next((i for i, line in enumerate(lines) if SAMPLES in line), None)
    if start is None:
        raise ValueError(
            f"--sass {path!r}: no {SAMPLES!r} column (expected ncu --page source --print-source sass --csv)"
        )
    head, *rows = csv.reader(lines[start:])
    col = {name: i for i, name in enumerate(head)}
    if "Source" not in col:
        raise ValueError(f"--sass {path!r}: no 'Source' column in {head}")
    rows = [r for r in rows if r]  # blank lines
    bad = [i for i, r in enumerate(rows) if len(r) != len(head)]
    if bad:
        raise ValueError(
            f"--sass {path!r}: {len(bad)} rows (first: data row {bad[0]}) do not have "
            f"the header's {len(head)} columns"
        )
    total = sum(_number(r[col[SAMPLES]]) for r in rows)
    if not rows or total == 0:
        raise ValueError(f"--sass {path!r}: no stall samples in {len(rows)} instruction rows")
    by_op = collections.Counter()
    for r in rows:
        by_op[_opcode(r[col["Source"]])] += _number(r[col[SAMPLES]])
    out = [
        f"{len(rows)} instructions, {total:.0f} stall samples",
        "by opcode: " + ", ".join(f"{op} {n / total:.1%}" for op, n in by_op.most_common(12)),
    ]
    stall_cols = [
        (name, i) for name, i in col.items() if name.startswith("stall_") and "Not Issued" not in name
    ]
    reasons = [(sum(_number(r[i]) for r in rows), name) for name, i in stall_cols]
    out.append(
        "by reason: "
        + ", ".join(f"{name[6:]} {n / total:.1%}" for n, name in sorted(reasons, reverse=True) if n)
    )
    executed = col.get("Instructions Executed")
    out.append(f"{'samples':>9s} {'share':>6s} {'executed':>12s}  instruction")
    for r in sorted(rows, key=lambda r: -_number(r[col[SAMPLES]]))[:top]:
        n = _number(r[col[SAMPLES]])
        ran = "-" if executed is None else f"{_number(r[executed]):.0f}"
        out.append(f"{n:9.0f} {n / total:6.1%} {ran:>12s}  {' '.join(r[col['Source']].split())}")
    if executed is not None:
        out += _by_execution_count(rows, col, executed, total, stall_cols)
        if "stall_selected" in col:
            out.append(_loop_cycles(rows, col, executed))
    return "\n".join(out)


def _opcode(source: str, keep: tuple[str, ...] = ()) -> str:
    """A SASS line's opcode without predicate and modifiers (``@!P1 BRA`` -> BRA), or with its
    first modifier for the opcodes in ``keep`` (``MUFU.EX2``, ``MUFU.TANH``)."""
    words = [w for w in source.split() if not w.startswith("@")]
    if not words:
        return "?"
    parts = words[0].split(".")
    return ".".join(parts[:2]) if parts[0] in keep else parts[0]


def _bodies(rows, col, executed) -> list[tuple[float, list]]:
    """(execution count, its instructions), the most sampled first: the instructions of one loop
    body ran equally often (the compute warpgroups' loop by 8 warps per block pair, the
    producer's by 4)."""
    by_count = collections.defaultdict(list)
    for r in rows:
        by_count[_number(r[executed])].append(r)
    return sorted(by_count.items(), key=lambda kv: -sum(_number(r[col[SAMPLES]]) for r in kv[1]))


def _loop_cycles(rows, col, executed) -> str:
    """The hottest loop body (the execution count with the most samples): warp cycles per
    instruction by opcode. An instruction's samples over the samples in which a warp was
    ``selected`` (issued) at one of the body's instructions: about 1 for one that issues at once,
    more for one its warp waits at (a MUFU's pipe, a barrier's spin)."""
    ran, body = _bodies(rows, col, executed)[0]
    issued = sorted(_number(r[col["stall_selected"]]) for r in body)[len(body) // 2]  # median
    if not issued:
        return f"hottest loop (ran {ran:.0f}): no selected samples"
    ops = collections.defaultdict(lambda: [0, 0.0])
    for r in body:
        op = _opcode(r[col["Source"]], keep=("MUFU",))
        ops[op][0] += 1
        ops[op][1] += _number(r[col[SAMPLES]]) / issued
    ranked = sorted(ops.items(), key=lambda kv: -kv[1][1])
    return (
        f"hottest loop (ran {ran:.0f}, {sum(n for n, _ in ops.values())} instructions), warp cycles: "
        + ", ".join(f"{op} {n} x {c / n:.1f}" for op, (n, c) in ranked[:10])
    )


def _by_execution_count(rows, col, executed, total, reasons, groups: int = 6) -> list[str]:
    """The samples of the instructions that ran equally often (a loop body's instructions share
    one count: e.g. the compute warpgroups' loop ran by 8 warps per block pair, the producer's by
    4), the ``groups`` largest, each with its top stall reasons."""
    ranked = _bodies(rows, col, executed)
    out = ["by execution count (the instructions of one loop body ran equally often):"]
    for ran, group in ranked[:groups]:
        n = sum(_number(r[col[SAMPLES]]) for r in group)
        if n == 0:
            break
        why = sorted(((sum(_number(r[i]) for r in group), name[6:]) for name, i in reasons), reverse=True)
        out.append(
            f"  ran {ran:.0f}: {len(group)} instructions, {n / total:.1%} of the samples ("
            + ", ".join(f"{name} {k / n:.0%}" for k, name in why[:4] if k)
            + ")"
        )
    return out


PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
PTXAS_REGS = re.compile(r"Used (\d+) registers")


def ptxas_summary(path: str) -> list[dict]:
    """Per compiled kernel, in compile order, from the output of a run with
    ``MOSAIC_GPU_DUMP_PTXAS=1`` (and optionally ``MOSAIC_GPU_DUMP_SASS=1``; plain or .gz): its
    name, ptxas's registers, stack frame and spill bytes, and, where the SASS follows, how many
    local-memory loads and stores (``LDL``/``STL``: the spill code) it contains."""
    with _open_text(path, errors="replace") as f:
        text = f.read()
    starts = list(PTXAS_ENTRY.finditer(text))
    if not starts:
        raise ValueError(
            f'--ptxas {path!r}: no "Compiling entry function" line (run with MOSAIC_GPU_DUMP_PTXAS=1)'
        )
    kernels = []
    for n, m in enumerate(starts):
        part = text[m.end() : starts[n + 1].start() if n + 1 < len(starts) else len(text)]
        frame, regs = PTXAS_FRAME.search(part), PTXAS_REGS.search(part)
        stack, stores, loads = (int(x) for x in frame.groups()) if frame else (None,) * 3
        kernels.append(
            {
                "kernel": m.group(1),
                "registers": int(regs.group(1)) if regs else None,
                "stack_bytes": stack,
                "spill_store_bytes": stores,
                "spill_load_bytes": loads,
                "sass_LDL": len(re.findall(r"\bLDL(?:\.[A-Z0-9]+)*\s", part)),
                "sass_STL": len(re.findall(r"\bSTL(?:\.[A-Z0-9]+)*\s", part)),
            }
        )
    return kernels


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shape", default="32:8:128", help="heads:kv_heads:head_dim")
    ap.add_argument("--seq", type=int, default=65536)
    ap.add_argument("--causal", type=int, choices=(0, 1), default=0)
    ap.add_argument(
        "--backward", default="default", help="a hopper_check.py --backwards entry, e.g. default/bwd_stages=3"
    )
    ap.add_argument(
        "--softcap",
        type=float,
        default=None,
        help="also the soft-capped step (logits capped at C) after the plain one, for side-by-side counters",
    )
    ap.add_argument("--interpret", action="store_true", help="CPU dry run, no cuDNN")
    ap.add_argument(
        "--ptxas",
        metavar="LOG",
        help="print registers and spills per kernel from "
        "the output of a run with MOSAIC_GPU_DUMP_PTXAS=1 (and _SASS=1)",
    )
    ap.add_argument("--summarize", metavar="CSV", help="print the summary of an ncu details CSV")
    ap.add_argument("--durations", metavar="CSV", help="print each kernel's duration from an ncu details CSV")
    ap.add_argument("--pipes", metavar="CSV", help="print each kernel's pipe use from an ncu raw-page CSV")
    ap.add_argument(
        "--sass", metavar="CSV", help="print where the warps of an ncu source-page CSV (SASS) wait"
    )
    return ap


def _report(args: argparse.Namespace) -> dict | None:
    """Where a report option is given (--ptxas, --sass, --pipes, --durations, --summarize), prints
    that report of the file and returns it; else None (profile a run)."""
    if args.ptxas:
        kernels = ptxas_summary(args.ptxas)
        for row in kernels:
            print(" ".join(f"{k}={v}" for k, v in row.items()))
        return {"ptxas": kernels}
    if args.sass:
        text = sass_summary(args.sass)
        print(text)
        return {"sass": text}
    if args.pipes:
        text = pipes(args.pipes)
        print(text)
        return {"pipes": text}
    if args.durations:
        kernels = durations(args.durations)
        print(durations_table(kernels))
        return {"durations": kernels}
    if args.summarize:
        text = summarize(args.summarize)
        print(text)
        return {"summary": text}
    return None


def main(argv: list[str]) -> dict:
    args = _parser().parse_args(argv)
    report = _report(args)
    if report is not None:
        return report
    h, kvh, d = parse_shape(args.shape)
    if args.seq < 1:
        raise ValueError(f"--seq {args.seq}: must be positive")
    if args.softcap is not None and not args.softcap > 0:
        raise ValueError(f"--softcap {args.softcap}: must be positive")
    bs = block_sizes(d, args.backward, bool(args.causal))
    q, k, v, do = inputs(args.seq, h, kvh, d)
    fwd, bwd = pallas_fns(bool(args.causal), bs, args.interpret)
    o, lse = jax.block_until_ready(fwd(q, k, v))
    grads = jax.block_until_ready(bwd(q, k, v, do, o, lse))
    out = {"pallas_hopper": (o, grads), "block_sizes": bs}
    if args.softcap is not None:
        cfwd, cbwd = pallas_fns(bool(args.causal), bs, args.interpret, softcap=args.softcap)
        o, lse = jax.block_until_ready(cfwd(q, k, v))
        out["softcap"] = (o, jax.block_until_ready(cbwd(q, k, v, do, o, lse)))
    if not args.interpret:
        cf, cg = cudnn_fns(bool(args.causal))
        out["cudnn"] = (jax.block_until_ready(cf(q, k, v)), jax.block_until_ready(cg(q, k, v, do)))
    print(
        f"profiled L={args.seq} {args.shape} causal={args.causal} {bs}: pallas_hopper forward, "
        f"backward{'' if args.softcap is None else f', soft cap {args.softcap} forward, backward'}"
        f"{'' if args.interpret else ', cuDNN forward, cuDNN gradient'}",
        flush=True,
    )
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
