"""Bytes one device sends per collective kind, read from an optimized HLO module's text.

Every ``collective-permute`` sends its operand, every ``all-to-all`` over a group of g sends
(g - 1) / g of it, every ``all-gather`` (g - 1) / g of its result, every ``reduce-scatter`` g - 1
times its result; ops inside loops count once per iteration (XLA's ``known_trip_count``) and calls
and branches are followed from the entry computation. Used by ``cp_bytes.py`` and the tests that
check the strategies' byte counts (``ringattention.strategy``) against compiled programs.
"""

from __future__ import annotations

import math
import re

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4}
DTYPE_BYTES.update({"s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8})
_COMP = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([\w\-]+)\((.*)$")
_CALLS = re.compile(r"\b(?:body|to_apply|calls|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
COLLECTIVES = ("collective-permute", "all-to-all", "all-gather", "all-reduce", "reduce-scatter")


def _bytes(type_str: str) -> int:
    total = 0
    for dt, dims in _ARRAY.findall(type_str):
        if dt in DTYPE_BYTES:
            total += DTYPE_BYTES[dt] * math.prod(int(d) for d in dims.split(",") if d)
    return total


def group_size(rest: str) -> int:
    m = re.search(r"replica_groups=\{\{([\d,]*)\}", rest)
    if m:
        return len(m.group(1).split(","))
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", rest)
    if m:
        return int(m.group(2))
    # jax >= 0.12 prints mesh-based groups: replica_groups=mesh['sp'=2,'usp'=2] {'usp'}, a group
    # per combination of the other axes, spanning the axes in braces
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", rest)
    if m:
        sizes = {name: int(n) for name, n in re.findall(r"'([^']+)'=(\d+)", m.group(1))}
        axes = re.findall(r"'([^']+)'", m.group(2))
        if axes and all(a in sizes for a in axes):
            return math.prod(sizes[a] for a in axes)
    raise ValueError(f"cannot read the replica groups of {rest[:200]!r}")


def _computations(text: str) -> tuple[dict, str]:
    comps, entry, name = {}, None, None
    for line in text.splitlines():
        if name is None:
            m = _COMP.match(line)
            if m:
                name = m.group(1)
                comps[name] = []
                entry = name if line.startswith("ENTRY") else entry
        elif line.strip() == "}":
            name = None
        else:
            m = _INSTR.match(line)
            if m:
                comps[name].append(m.groups()[1:])  # (type, op, rest)
    return comps, entry


def hlo_collective_bytes(text: str) -> dict:
    """Bytes one device sends, by collective kind, in an optimized HLO module's text."""
    comps, entry = _computations(text)
    times = {}

    def visit(name, m):
        times[name] = times.get(name, 0) + m
        for _, op, rest in comps.get(name, ()):
            trips = 1
            if op == "while":
                hit = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', rest)
                if not hit:
                    raise ValueError(f"while loop without a known trip count in {name}")
                trips = int(hit.group(1))
            callees = _CALLS.findall(rest)
            for group in _BRANCHES.findall(rest):
                callees += [c.strip().lstrip("%") for c in group.split(",")]
            for callee in callees:
                if callee in comps:
                    visit(callee, m * (trips if op == "while" else 1))

    visit(entry, 1)
    out = dict.fromkeys(COLLECTIVES, 0.0)
    for name, m in times.items():
        for type_str, op, rest in comps[name]:
            if op.endswith(("-start", "-done")) and op.rsplit("-", 1)[0] in COLLECTIVES:
                raise ValueError(f"async collective {op} is not handled (CPU emits none)")
            if op not in COLLECTIVES:
                continue
            sent = _bytes(type_str)
            if op in ("all-to-all", "all-gather"):  # of the (gathered) result
                g = group_size(rest)
                sent = sent * (g - 1) / g
            elif op == "reduce-scatter":  # every other member's share of the input
                sent = sent * (group_size(rest) - 1)
            out[op] += m * sent
    return out
