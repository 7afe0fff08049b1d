"""Writes ``make test-gpu``'s summary (``benchmarks/results/gpu_suite.md``) from pytest's JUnit XML:
date, commit, device, jax, and every case with its result and time.

  python tools/gpu_suite_summary.py gpu_suite.xml gpu_suite.md [--commit HASH]

The commit is ``--commit``, else ``$GPU_SUITE_COMMIT``, else ``git rev-parse`` (a device machine's
copy of the tree may have no ``.git``); the device and jax are read on the machine it runs on.
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


def _commit(given: str | None) -> str:
    if given or os.environ.get("GPU_SUITE_COMMIT"):
        return given or os.environ["GPU_SUITE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def render(rows, *, commit: str, device: str, jax_version: str, date: str) -> str:
    counts = {w: sum(r[1] == w for r in rows) for w in ("pass", "FAIL", "skip")}
    lines = ["# `make test-gpu`: what only a GPU shows", "",
             f"{date}, commit `{commit}`, {device}, jax {jax_version}: **{counts['pass']} passed, "
             f"{counts['FAIL']} failed, {counts['skip']} skipped** in {sum(r[2] for r in rows):.0f} s "
             "(tests/test_gpu_suite.py; regenerate with `make test-gpu` on the device).", "",
             "| case | result | s | note |", "|---|---|---|---|"]
    lines += [f"| `{n}` | {r} | {t:.1f} | {m.replace('|', '/')} |" for n, r, t, m in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("xml")
    ap.add_argument("md")
    ap.add_argument("--commit")
    args = ap.parse_args(argv)
    import jax

    rows = cases(args.xml)
    text = render(rows, commit=_commit(args.commit), device=jax.devices()[0].device_kind,
                  jax_version=jax.__version__, date=datetime.date.today().isoformat())
    with open(args.md, "w") as f:
        f.write(text)
    print(text.split("\n")[2])


if __name__ == "__main__":
    main()
