"""What the hot loops of a compiled kernel hold, from its SASS (``nvdisasm -c`` output).

A loop is a backward branch: a ``BRA`` whose target label sits at a lower address than the branch.
For each loop that issues tensor-core work (``HGMMA``) this counts its instructions, its
tensor-core instructions and the local-memory traffic inside it, i.e. the register spills a
kernel pays on every trip (``LDL``/``STL``: "SpillRefill"), where ptxas's summary only gives the
bytes of the whole kernel. Spin-wait loops (a try-wait and its branch) issue no ``HGMMA`` and are
left out, as are the jumps from the out-of-line retry stubs of those waits back into the code
(an unconditional backward branch right after the stub's own conditional backward one; a loop's
latch is a conditional forward exit followed by an unconditional backward branch, or a conditional
backward branch). A loop that contains another is reported with the inner loop's instructions included.

Used by ``hopper_aot.py`` (the kernels compiled for an H200 without a GPU); also runs on a saved
listing: ``python tools/sass_loops.py FILE.sass``.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import sys

_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


@dataclasses.dataclass(frozen=True)
class Loop:
    start: int  # address of the first instruction (the branch target)
    end: int  # address of the backward branch
    instructions: int
    hgmma: int
    ldl: int  # local-memory loads (spill refills) per trip
    stl: int  # local-memory stores per trip
    bar: int  # named barriers (BAR.*) and mbarrier try-waits per trip

    def row(self) -> str:
        return (
            f"loop {self.start:#06x}-{self.end:#06x}: {self.instructions} instructions, "
            f"{self.hgmma} HGMMA, {self.ldl} LDL, {self.stl} STL, {self.bar} barrier ops"
        )


def parse(text: str) -> tuple[list[tuple[int, str]], dict[str, int]]:
    """(address, instruction) in listing order, and each label's address."""
    instrs, labels, pending = [], {}, []
    for line in text.splitlines():
        if m := _LABEL.match(line):
            pending.append(m.group(1))
        elif m := _INSTR.match(line):
            addr = int(m.group(1), 16)
            for name in pending:
                labels[name] = addr
            pending = []
            instrs.append((addr, m.group(2)))
    return instrs, labels


def _opcode(instr: str) -> str:
    words = instr.split()
    return words[1] if words and words[0].startswith("@") and len(words) > 1 else words[0]


def _backward(item: tuple[int, str], labels: dict[str, int]) -> bool:
    """Whether an instruction is a branch to a label at or before it."""
    addr, instr = item
    m = _TARGET.search(instr)
    return _opcode(instr).startswith("BRA") and m is not None and labels.get(m.group(1), addr + 1) <= addr


def loops(text: str) -> list[Loop]:
    """The loops of a SASS listing that issue ``HGMMA``, outermost first."""
    instrs, labels = parse(text)
    found = []
    for n, (addr, instr) in enumerate(instrs):
        if not _opcode(instr).startswith("BRA"):
            continue
        m = _TARGET.search(instr)
        if m is None or labels.get(m.group(1), addr + 1) > addr:
            continue
        if not instr.startswith("@") and n and _backward(instrs[n - 1], labels):
            continue  # the exit of an out-of-line retry stub, jumping back to the waiting code
        start = labels[m.group(1)]
        body = [_opcode(i) for a, i in instrs if start <= a <= addr]
        hgmma = sum(op.startswith("HGMMA") for op in body)
        if hgmma:
            found.append(
                Loop(
                    start,
                    addr,
                    len(body),
                    hgmma,
                    sum(op.startswith("LDL") for op in body),
                    sum(op.startswith("STL") for op in body),
                    sum(op.startswith(("BAR.", "SYNCS.PHASECHK")) for op in body),
                )
            )
    return sorted(found, key=lambda lp: (lp.start, -lp.end))


def opcode_mix(text: str, loop: Loop, top: int = 16) -> list[tuple[str, int]]:
    """The ``top`` most frequent opcodes (without modifiers: HGMMA, R2UR, UIADD3, ...) of one trip
    through ``loop``."""
    instrs, _ = parse(text)
    ops = [_opcode(i).split(".")[0] for a, i in instrs if loop.start <= a <= loop.end]
    return collections.Counter(ops).most_common(top)


def summary(text: str) -> list[str]:
    """One line per HGMMA loop, plus the kernel's total local-memory instructions."""
    instrs, _ = parse(text)
    ops = [_opcode(i) for _, i in instrs]
    head = (
        f"{len(ops)} instructions, {sum(o.startswith('HGMMA') for o in ops)} HGMMA, "
        f"{sum(o.startswith('LDL') for o in ops)} LDL, {sum(o.startswith('STL') for o in ops)} "
        "STL in the whole kernel"
    )
    return [head] + [lp.row() for lp in loops(text)]


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path) as f:
            print(path)
            print("\n".join("  " + line for line in summary(f.read())))
