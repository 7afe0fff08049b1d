"""Writes ``make test-gpu``'s summary (``benchmarks/results/gpu_suite.md``) from pytest's JUnit XML:
date, commit, device, jax, and every case with its result and time.

  python tools/gpu_suite_summary.py gpu_suite.xml gpu_suite.md [--commit HASH]
  python tools/gpu_suite_summary.py run.xml out.md --commit A --rerun cli.xml@B --device ... --jax ...

The commit is ``--commit``, else ``$GPU_SUITE_COMMIT``, else ``git rev-parse`` (a device machine's
copy of the tree may have no ``.git``); the device and jax are ``--device`` / ``--jax``, else read on
the machine the tool runs on. ``--rerun XML@COMMIT`` (repeatable): cases run again at another
commit; each replaces the first run's result of that case, and the table says which run it is from.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import xml.etree.ElementTree as ET


def cases(xml_path: str) -> list[tuple[str, str, float, str]]:
    """(test id, "pass" / "FAIL" / "skip", seconds, message) for every test case in the XML."""
    out = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        result, message = "pass", ""
        for tag, word in (("failure", "FAIL"), ("error", "FAIL"), ("skipped", "skip")):
            node = case.find(tag)
            if node is not None:
                result, message = word, (node.get("message") or "").splitlines()[0][:160]
                break
        out.append((name, result, float(case.get("time", 0.0)), message))
    return out


def wall_seconds(xml_path: str) -> float:
    """The run's wall time (the test suites' ``time``; cases overlap under pytest-xdist)."""
    return sum(float(s.get("time", 0.0)) for s in ET.parse(xml_path).getroot().iter("testsuite"))


def _commit(given: str | None) -> str:
    if given or os.environ.get("GPU_SUITE_COMMIT"):
        return given or os.environ["GPU_SUITE_COMMIT"]
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def merge(runs: list[tuple[list, str]]) -> list[tuple[str, str, float, str, int]]:
    """Cases of every run (``(rows, commit)``), a later run's result of a case replacing an earlier
    one's; each row gains the index of its run."""
    merged: dict[str, tuple] = {}
    for i, (rows, _) in enumerate(runs):
        for name, result, t, message in rows:
            if name in merged:  # what the earlier run said stays in the note
                was = merged[name]
                message = "; ".join(
                    x
                    for x in (message, f"run {was[4] + 1}: {was[1]}" + (f" ({was[3]})" if was[3] else ""))
                    if x
                )
            merged[name] = (name, result, t, message, i)
    return sorted(merged.values())


def render(rows, *, runs: list[tuple[str, float, int]], device: str, jax_version: str, date: str) -> str:
    """``rows`` from :func:`merge`; ``runs``: (commit, wall seconds, cases) of each run."""
    counts = {w: sum(r[1] == w for r in rows) for w in ("pass", "FAIL", "skip")}
    said = [f"run {i + 1}: commit `{c}`, {n} cases in {t:.0f} s" for i, (c, t, n) in enumerate(runs)]
    lines = [
        "# `make test-gpu`: what only a GPU shows",
        "",
        f"{date}, {device}, jax {jax_version}: **{counts['pass']} passed, {counts['FAIL']} "
        f"failed, {counts['skip']} skipped** ({'; '.join(said)}). tests/test_gpu_suite.py; "
        "regenerate with `make test-gpu` on the device.",
        "",
    ]
    multi = len(runs) > 1
    lines += [
        "| case | result | s |" + (" run |" if multi else "") + " note |",
        "|---|---|---|" + ("---|" if multi else "") + "---|",
    ]
    for name, result, t, message, run in rows:
        lines.append(
            f"| `{name}` | {result} | {t:.1f} |"
            + (f" {run + 1} |" if multi else "")
            + f" {message.replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("xml")
    ap.add_argument("md")
    ap.add_argument("--commit")
    ap.add_argument("--rerun", action="append", default=[], metavar="XML@COMMIT")
    ap.add_argument("--device")
    ap.add_argument("--jax", dest="jax_version")
    args = ap.parse_args(argv)
    device, jax_version = args.device, args.jax_version
    if device is None or jax_version is None:
        import jax

        device = device or jax.devices()[0].device_kind
        jax_version = jax_version or jax.__version__
    paths = [(args.xml, _commit(args.commit))] + [tuple(r.rsplit("@", 1)) for r in args.rerun]
    runs = [(cases(p), c) for p, c in paths]
    text = render(
        merge(runs),
        runs=[(c, wall_seconds(p), len(rows)) for (p, c), (rows, _) in zip(paths, runs)],
        device=device,
        jax_version=jax_version,
        date=datetime.date.today().isoformat(),
    )
    with open(args.md, "w") as f:
        f.write(text)
    print(text.split("\n")[2])


if __name__ == "__main__":
    main()
