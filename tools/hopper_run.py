"""What the parts of one ``hopper_check.py`` run share: its record and its ``--backwards`` variants.

* the record: every line printed and kept (``LINES``), with a dict per result (``RECORDS``), both
  rewritten to ``<OUT["prefix"]>.json`` / ``.txt`` after each line, so a run cut short keeps what it
  had; the time budget (``BUDGET_S``: no new work after it), ``guarded`` (one part, its exception
  reported and the run going on) and the ``watchdog`` (writes and exits past ``--hard-limit``);
* the ``--backwards`` entries ("name[/field=value...]") as ``pallas_hopper.BlockSizes``
  (``block_sizes``, also the ``--backward`` of ``hopper_profile.py`` and ``hopper_aot.py``), and
  those that differ at a head dim (``distinct_backwards``).

The checks (``hopper_check.py``, the command line) and the timing (``hopper_bench.py``) both read
this module's state, which the command line sets: a module apart, because the script's own module
is ``__main__``, which ``import hopper_check`` would load a second time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import traceback

from ringattention.kernels.hopper import pallas_hopper as ph

BUDGET_S = 250.0  # start no new work after this many seconds
HARD_LIMIT_S = 290.0  # a watchdog writes what there is and exits (e.g. a kernel that hangs)
T0 = time.perf_counter()
LINES: list[str] = []
RECORDS: list[dict] = []
OUT = {"prefix": "hopper_check"}
BACKWARDS = list(ph.BACKWARDS)  # --backwards: the variants to check and time


def _field_value(text: str):
    """A --backwards field's value: an int, a bool ("true" / "false"), None ("none"), else the
    string."""
    if text.lstrip("-").isdigit():
        return int(text)
    return {"true": True, "false": False, "none": None}.get(text, text)


def block_sizes(spec: str, d: int, causal: bool = True, v_head_dim: int | None = None) -> ph.BlockSizes:
    """A --backwards entry, "name[/field=value...]" (e.g. "mosaic/bwd_block_k=128",
    "default/schedule=overlap"), as BlockSizes: the defaults for head dim ``d`` and ``causal`` with
    that backward ("default": the default's; "deterministic": what ``ring_attention(...,
    deterministic=True)`` runs there, ``pallas_hopper.deterministic_block_sizes``) and those
    fields. ``v_head_dim``: v's own head dim (MLA), as ``default_block_sizes`` takes it."""
    name, *fields = spec.split("/")
    over = {k: _field_value(v) for k, v in (f.split("=") for f in fields)}
    if name == "deterministic":
        return dataclasses.replace(ph.deterministic_block_sizes(None, d, causal, v_head_dim), **over)
    if name != "default":
        over["backward"] = name
    return dataclasses.replace(ph.default_block_sizes(d, causal, v_head_dim=v_head_dim), **over)


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
