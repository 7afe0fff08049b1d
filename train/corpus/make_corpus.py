"""Regenerates ``train/corpus/kjv.jsonl``: chapters of the King James Bible (public domain).

The text comes from Debian's ``bible-kjv`` package (``apt-get install bible-kjv``), whose ``bible``
program prints verses. Each chapter becomes one JSONL document ``{"text": ..., "source": ...}``.
This script is only needed to rebuild the shipped file; training never runs it.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess

BOOKS = ("Genesis", "Ruth", "Esther", "Proverbs", "Ecclesiastes", "Jonah", "Mark", "Luke")
VERSE = re.compile(r"^\S+?(\d+):(\d+) (.*)$")
OUT = pathlib.Path(__file__).parent / "kjv.jsonl"


def chapter(book: str, number: int) -> list[str]:
    """Verses of one chapter; empty once ``number`` runs past the book (``bible`` clamps)."""
    text = subprocess.run(
        ["bible", "-f", f"{book} {number}:1-{number}:999"], check=True, capture_output=True, text=True
    ).stdout
    verses = []
    for line in text.splitlines():
        m = VERSE.match(line.strip())
        if m is None:
            if verses and line.strip():
                verses[-1] += " " + line.strip()
            continue
        if int(m.group(1)) != number:
            return []
        verses.append(m.group(3))
    return verses


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w") as f:
        for book in BOOKS:
            number = 1
            while verses := chapter(book, number):
                doc = {
                    "text": f"{book} {number}\n\n" + "\n".join(verses) + "\n",
                    "source": f"King James Bible (public domain), {book} {number}",
                }
                f.write(json.dumps(doc) + "\n")
                number += 1


if __name__ == "__main__":
    main()
