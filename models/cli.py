"""What the command lines of ``models`` (and ``train.generate``) share: one-line errors.

A mistake of the user's (a bad option, a missing file, a config that cannot work) is one line on
stderr, ``PROG: error: ...``, and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

EXIT_USAGE = 2
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, OSError)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``--help`` still prints the usage)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (--help lists the options)\n")


def run(
    main: Callable[[Sequence[str] | None], Any],
    prog: str,
    argv: Sequence[str] | None = None,
    errors: tuple[type[BaseException], ...] = (),
) -> int:
    """Runs ``main(argv)``; a user error (``USER_ERRORS`` + ``errors``) becomes one line on stderr
    and exit status 2, success 0."""
    try:
        main(argv)
    except (*USER_ERRORS, *errors) as e:
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    return 0
