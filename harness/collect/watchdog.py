"""A bound on every env step: ``collector.env_step_timeout_s``.

An env whose ``step`` never returns (a deadlocked simulator, a ``sleep`` in
its code) would hold its collector forever, and the job would end, if at all,
with the trainer's "collector rank r died or stalled" and a gloo timeout that
name neither the env nor the step. A hung call cannot be taken back from the
thread that runs it, so the bound lives in a second thread: the stepping
thread records which env it enters and when (two attribute stores per step),
and a daemon thread, waking a few times per timeout, ends the process when one
step has lasted longer than the bound, after writing an error that names the
env, its index, its seed and the step.

Limits: the process ends (``os._exit``: the hung thread may hold any lock, so nothing that could
wait on it runs), and the env is not made again as after an exception: with
``collector.max_restarts`` its rank replaces the worker process (:mod:`harness.roles.supervisor`,
which also catches a hang that holds the GIL, where this thread cannot run), else torchrun
``--max-restarts`` restarts the job from its newest checkpoint. The bound is checked every quarter
of it, so a hang is named between 1 and 1.25 timeouts after the step began. A step that is merely
slow past the bound is taken for a hung one: set the bound well above the env's slowest step, or 0
to turn the watchdog off."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

HUNG_EXIT = 70  # EX_SOFTWARE: the collector's own bound ended it, not a signal


class StepWatchdog:
    """Ends the process when a watched call lasts longer than ``timeout_s``."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.current: tuple[Callable[[], str], float] | None = None  # (what is running, since when)
        self.thread = threading.Thread(target=self._watch, name="env-step-watchdog", daemon=True)
        self.thread.start()

    def enter(self, describe: Callable[[], str]) -> None:
        """A watched call begins; ``describe`` names it, if it hangs."""
        self.current = (describe, time.monotonic())

    def leave(self) -> None:
        self.current = None

    def _watch(self) -> None:
        while True:
            time.sleep(self.timeout_s / 4)
            current = self.current
            if current is not None and time.monotonic() - current[1] > self.timeout_s:
                self._expire(current[0]())

    def _expire(self, what: str) -> None:
        rank = os.environ.get("RANK", "0")
        message = (
            f"\ncollector rank {rank} (pid {os.getpid()}): {what} has not returned after "
            f"collector.env_step_timeout_s={self.timeout_s:g} s: the env hangs. This collector "
            "stops (a hung step cannot be taken back); fix the env, or raise "
            "collector.env_step_timeout_s if its steps are that slow\n"
        )
        os.write(2, message.encode())
        os._exit(HUNG_EXIT)


_watchdogs: dict[float, StepWatchdog] = {}
_lock = threading.Lock()


def watchdog(timeout_s: float) -> StepWatchdog | None:
    """This process's watchdog for ``timeout_s`` (one thread, whatever the envs); None for 0 (no
    bound)."""
    if timeout_s <= 0:
        return None
    with _lock:
        if timeout_s not in _watchdogs:
            _watchdogs[timeout_s] = StepWatchdog(timeout_s)
        return _watchdogs[timeout_s]
