"""A mistake in a verb's command line: one line, ``error: ...``, and exit status 2.

Only the standard library, so that every verb can use it before its slow imports, and
``harness gpu-check`` on a Python that lacks the harness's dependencies. (The Hydra entry points'
own front door, one voice for a job's many ranks, is :mod:`harness.cli.errors`.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn

USAGE_ERROR = 2  # argparse's status for a usage error; harness.cli.launch reads it from ranks
HELP_FLAGS = ("--help", "-h")
# Hydra's flags that print something and exit: rank 0 prints it, every other rank leaves at once.
PRINTING_FLAGS = ("--cfg", "-c", "--info", "-i", "--hydra-help", "--shell-completion", "-sc")


class UsageError(SystemExit):
    """A mistake in the command. :func:`command` says it as one line ``error: <message>`` and exits
    with status 2; raised anywhere else it still stops the program with its message."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class Parser(argparse.ArgumentParser):
    """argparse, whose mistakes are a :class:`UsageError` (one line, no usage block), and whose
    description keeps its lines as written (a verb's is its module's docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} ({self.prog} --help says more)")


def command(main: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """``main(argv)`` as a program: a mistake is one line on stderr and status 2."""
    try:
        return main(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(f"error: {e.message}", file=sys.stderr, flush=True)
        return USAGE_ERROR


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(flags and their values, key=value overrides)``: an override is a word with ``=`` that is
    not a flag (``--out=x`` is a flag), wherever it stands, so that a flag taking several values
    (``--seeds 1 2``) never swallows one."""
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    return [a for a in argv if a not in overrides], overrides
