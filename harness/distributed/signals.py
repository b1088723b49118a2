"""Stopping a run: preemption signals and Ctrl-C.

SLURM sends SIGUSR1 ahead of a time limit (``--signal=USR1@120``) and
SIGTERM on preemption; torchrun forwards SIGTERM and SIGINT to its workers;
a terminal sends SIGINT on Ctrl-C. Once training has started
(:func:`install`), SIGTERM, SIGUSR1 and the first SIGINT all mean "checkpoint
at the next safe point, then stop": the handler only sets a flag; the trainer
loop checks it between updates, writes a checkpoint and stops; collectors pass
it on to their trainer with their next batch.

A second SIGINT stops the process at once. The first one puts SIGINT back to
the system's default action, which ends the process without running any
Python (so no KeyboardInterrupt traceback), even while it is blocked inside a
collective, where a Python handler would not run until the call returned.
During start-up, a Ctrl-C has nothing to save: :func:`quiet_interrupt` makes
the first SIGINT end the process the same way. SIGTERM and SIGUSR1, though,
mean the same from the moment ``main`` runs (``install(interrupt=False)``): a
scheduler that preempts a job still starting must not see ranks die one by
one, each killing its peers' connections, but a stop at the first safe point,
after the first update, as later.
"""

from __future__ import annotations

import os
import signal

_requested: list[int] = []
_announce = False
ACK = "Ctrl-C: stopping at the next safe point after a checkpoint (Ctrl-C again stops at once)\n"


def _handler(signum: int, frame: object) -> None:
    _requested.append(signum)
    if signum == signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # the second Ctrl-C ends the process
        if _announce:
            # os.write, not print: a handler may run in the middle of another write.
            # On a terminal, replace the progress bar's line rather than break it.
            os.write(1, (("\r\x1b[2K" if os.isatty(1) else "") + ACK).encode())


def _sigint_wanted() -> bool:
    """False where SIGINT was ignored when the process started (a background
    job of a script): it stays ignored."""
    return signal.getsignal(signal.SIGINT) is not signal.SIG_IGN


def quiet_interrupt() -> None:
    """Start-up: Ctrl-C ends the process at once, without a traceback."""
    if _sigint_wanted():
        signal.signal(signal.SIGINT, signal.SIG_DFL)


def install(announce: bool = False, interrupt: bool = True) -> None:
    """From now on SIGTERM, SIGUSR1 and a first SIGINT ask for a checkpoint and
    a stop. ``announce``: say so on the console when Ctrl-C arrives (trainer 0).
    ``interrupt=False`` (start-up): SIGINT keeps what :func:`quiet_interrupt` made it."""
    global _announce
    _announce = announce
    for sig in (signal.SIGTERM, signal.SIGUSR1) + (
        (signal.SIGINT,) if interrupt and _sigint_wanted() else ()
    ):
        signal.signal(sig, _handler)


def requested() -> bool:
    return bool(_requested)


def interrupted() -> bool:
    """Whether the stop was asked for with Ctrl-C (SIGINT) rather than by a scheduler."""
    return signal.SIGINT in _requested
