"""Preemption: SIGTERM or SIGUSR1 ask for a checkpoint at the next safe point.

SLURM sends SIGUSR1 ahead of a time limit (``--signal=USR1@120``) and
SIGTERM on preemption; torchrun forwards SIGTERM to its workers. The handler
only sets a flag: the trainer loop checks it between updates, writes a
checkpoint and stops; collectors pass it on to their trainer with their next
batch.
"""

from __future__ import annotations

import signal

_requested: list[int] = []


def _handler(signum, frame) -> None:
    _requested.append(signum)


def install() -> None:
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, _handler)


def requested() -> bool:
    return bool(_requested)
