"""Bitwise reproducibility of training: two runs of one config, and a run stopped and resumed.

Runs ``python -m train`` four times, each in a fresh process that compiles anew (as a new job
would): runs A and B train N steps; run C stops at step K (``stop_at``, with a checkpoint) and run
C' resumes it to N. Then compares, bitwise, every per-step metric except the timings (loss,
grad_norm, lr, tokens, model FLOPs) of A with B and of A with C + C', and the step-N parameters of
the three runs. Prints PASS or FAIL and writes ``<out>.json``.

    python benchmarks/determinism.py --out benchmarks/results/determinism_h200   # one H200
    python benchmarks/determinism.py --preset 3b --out ...    # head dim 128 (the fused backward)
    python benchmarks/determinism.py --no-deterministic ...   # the control: expected to differ
    python benchmarks/determinism.py --gpus 2 --out ...       # a ring of 2 GPUs (mesh sp=2)
    python benchmarks/determinism.py --cpu --out /tmp/det     # CPU smoke test (debug preset)

On a GPU the model is the preset with ``--layers`` layers at ``--seq`` tokens, batch 1, on the
embedded corpus; A, B and C run side by side on the one GPU (each limited to a share of its memory;
``--sequential``, or ``--gpus`` > 1, runs them one after another), then C'.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING = ("tokens_per_sec", "mfu")  # differ between runs by nature; everything else must not


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="1b", help="models.PRESETS name (GPU runs)")
    p.add_argument("--layers", type=int, default=4, help="num_layers override (GPU runs)")
    p.add_argument("--seq", type=int, default=8192, help="data.seq_len (GPU runs)")
    p.add_argument("--steps", type=int, default=6, help="N: steps of runs A and B")
    p.add_argument("--stop", type=int, default=3, help="K: run C stops here, C' resumes")
    p.add_argument(
        "--no-deterministic",
        dest="deterministic",
        action="store_false",
        help="the control: the same runs without deterministic: true",
    )
    p.add_argument("--sequential", action="store_true", help="run A, B and C one after another")
    p.add_argument(
        "--gpus",
        type=int,
        default=1,
        help="GPU runs: a ring of this many GPUs "
        "(mesh sp=N, CUDA devices 0..N-1); more than one runs A, B, C one after another",
    )
    p.add_argument(
        "--cpu",
        action="store_true",
        help="CPU smoke test: debug preset, a ring of 2 virtual devices, 64 tokens, run after run",
    )
    p.add_argument("--workdir", default=None, help="run directories (default: <out>_runs)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per phase")
    p.add_argument("--out", required=True, help="path prefix of the .json result")
    args = p.parse_args(argv)
    if not 0 < args.stop < args.steps:
        p.error(f"need 0 < --stop < --steps; got {args.stop=} {args.steps=}")
    if args.gpus < 1 or args.seq % (2 * args.gpus):
        p.error(f"need --gpus >= 1 and --seq divisible by 2 x --gpus (zigzag); got {args.gpus=} {args.seq=}")
    return args


def train_args(args, run_dir: str) -> list[str]:
    """The ``python -m train`` command line shared by every run (plus per-run options)."""
    common = [
        f"--run_dir={run_dir}",
        f"--steps={args.steps}",
        f"--deterministic={args.deterministic}",
        "--checkpoint.every=0",
        "--checkpoint.keep=2",
        "--checkpoint.async_save=false",
        "--log.every=1",
        "--log.tensorboard=false",
        "--log.progress=false",
        "--data.eval_fraction=0",
        "--sample.tokens=0",
        "--optim.warmup_steps=2",
    ]
    if args.cpu:  # a ring of two virtual devices
        return [
            "--config",
            os.path.join(ROOT, "configs", "debug.yaml"),
            *common,
            "--cpu_devices=2",
            "--mesh.fsdp=1",
            "--mesh.sp=2",
            "--data.seq_len=64",
            "--data.batch_size=2",
        ]
    return [
        "--config",
        os.path.join(ROOT, "configs", "llama1b_long.yaml"),
        *common,
        f"--model.preset={args.preset}",
        f"--model.overrides.num_layers={args.layers}",
        f"--data.seq_len={args.seq}",
        "--data.batch_size=1",
        "--optim.accum_steps=1",
        f"--mesh.sp={args.gpus}",
    ]


def launch(args, runs: dict[str, list[str]], parallel: bool) -> dict[str, dict]:
    """Starts ``python -m train`` for every run (all at once when ``parallel``); waits for
    them."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if not args.cpu:  # every run on the same GPUs
        env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(args.gpus))))
        if parallel and len(runs) > 1:  # sharing its memory
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{0.9 / len(runs):.2f}"
    out, procs = {}, {}
    for name, cmd in runs.items():
        log = open(os.path.join(args.workdir, f"{name}.log"), "w")  # noqa: SIM115
        procs[name] = (
            subprocess.Popen(
                [sys.executable, "-m", "train", *cmd], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            ),
            log,
            time.time(),
        )
        if not parallel:
            _wait(args, name, *procs.pop(name), out)
    for name, (proc, log, t0) in procs.items():
        _wait(args, name, proc, log, t0, out)
    return out


def _wait(args, name, proc, log, t0, out) -> None:
    try:
        proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()
    text = open(log.name).read()
    device = re.search(r"on (\d+) (\w+) devices", text)
    out[name] = {
        "returncode": proc.returncode,
        "seconds": round(time.time() - t0, 1),
        "devices": device.group(0) if device else None,
        "xla_deterministic_ops": "XLA deterministic ops" in text,
        "log": log.name,
    }
    print(f"run {name}: exit {proc.returncode} after {out[name]['seconds']} s", flush=True)


def train_records(run_dir: str) -> dict[int, dict]:
    """Per-step training records of ``run_dir/metrics.jsonl`` without the timing fields."""
    records = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "loss" in r:
                records[r["step"]] = {k: v for k, v in r.items() if k not in TIMING}
    return records


def first_difference(a: dict[int, dict], b: dict[int, dict]) -> dict | None:
    """The first step (and fields) where two runs' records differ, or None when all are equal."""
    for step in sorted(set(a) | set(b)):
        ra, rb = a.get(step), b.get(step)
        if ra != rb:
            fields = sorted(
                k for k in set(ra or {}) | set(rb or {}) if (ra or {}).get(k) != (rb or {}).get(k)
            )
            return {"step": step, "fields": fields, "a": ra, "b": rb}
    return None


def final_params(run_dir: str):
    """The newest checkpoint's parameters as host arrays (read on the CPU)."""
    import jax

    from train.generate import load_run

    _, params, _ = load_run(run_dir)
    return jax.tree.map(lambda x: jax.device_get(x), params)


def same_bits(a, b) -> bool:
    import jax
    import numpy as np

    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(la, lb, strict=True)
    )


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.workdir = args.workdir or args.out + "_runs"
    os.makedirs(args.workdir, exist_ok=True)
    dirs = {name: os.path.join(args.workdir, name) for name in ("a", "b", "c")}
    for d in dirs.values():
        if os.path.exists(d):
            raise SystemExit(f"{d} exists: give a new --out or --workdir")
    t0 = time.time()
    runs = launch(
        args,
        {
            "a": train_args(args, dirs["a"]),
            "b": train_args(args, dirs["b"]),
            "c": [*train_args(args, dirs["c"]), f"--stop_at={args.stop}"],
        },
        parallel=not (args.sequential or args.cpu or args.gpus > 1),
    )
    runs["c_resumed"] = launch(args, {"c_resumed": train_args(args, dirs["c"])}, parallel=False)["c_resumed"]
    result = {"args": vars(args), "runs": runs, "wall_seconds": None}
    if any(r["returncode"] != 0 for r in runs.values()):
        result.update(passed=False, error="a run failed; see its log")
    else:
        os.environ["JAX_PLATFORMS"] = "cpu"  # compare on the host; the runs are done
        a, b, c = (train_records(d) for d in dirs.values())
        pa, pb, pc = (final_params(d) for d in dirs.values())
        result.update(
            steps_compared=sorted(a),
            fields_compared=sorted(next(iter(a.values()))),
            metrics_a_vs_b=first_difference(a, b),
            metrics_a_vs_resumed=first_difference(a, c),
            params_a_vs_b_bitwise=same_bits(pa, pb),
            params_a_vs_resumed_bitwise=same_bits(pa, pc),
            tokens_per_sec_a=[r.get("tokens_per_sec") for r in _raw(dirs["a"])],
        )
        result["passed"] = (
            result["metrics_a_vs_b"] is None
            and result["metrics_a_vs_resumed"] is None
            and result["params_a_vs_b_bitwise"]
            and result["params_a_vs_resumed_bitwise"]
            and sorted(a) == list(range(1, args.steps + 1))
        )
    result["wall_seconds"] = round(time.time() - t0, 1)
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=1, default=str)
    verdict = "PASS" if result["passed"] else "FAIL"
    print(
        f"{verdict}: deterministic={args.deterministic}; A vs B: "
        f"{result.get('metrics_a_vs_b') or 'metrics equal'}, params "
        f"{'equal' if result.get('params_a_vs_b_bitwise') else 'differ'}; A vs stop/resume: "
        f"{result.get('metrics_a_vs_resumed') or 'metrics equal'}, params "
        f"{'equal' if result.get('params_a_vs_resumed_bitwise') else 'differ'}; "
        f"{result['wall_seconds']} s; wrote {args.out}.json",
        flush=True,
    )
    return result


def _raw(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "loss" in r]


if __name__ == "__main__":
    sys.exit(0 if main()["passed"] else 1)
