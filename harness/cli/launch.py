"""torchrun with Ctrl-C as people expect it: what ``harness train`` (and ``harness dataset``,
``harness join`` with ``--nproc`` above 1) launches through (:mod:`harness.cli.jobs`).

    python -m harness.cli.launch --standalone --nproc_per_node=3 -m harness.train [overrides]

It is torchrun (the same arguments, the same agent), except for SIGINT.
torchrun starts its workers in sessions of their own, so a terminal's Ctrl-C
reaches only the agent, which raises in its own main loop, forwards the signal
and prints a traceback. Here torchrun is told not to handle SIGINT (every other
signal it handles as before), and this process does instead:

- the first Ctrl-C is passed on to every worker, where it means what SIGTERM
  means (:mod:`harness.distributed.signals`: checkpoint at the next safe
  point, stop, and trainer 0 says how to resume); the workers exit cleanly and
  so does the agent, with exit status 130;
- a second Ctrl-C ends the workers at once (SIGKILL: a worker blocked inside
  a collective would not run a Python handler until the call returned), and
  this process exits at once with status 130. Shared-memory segments of
  killed workers are removed as after any SIGKILL (docs/weight_sync.md).

Neither prints a traceback. Nor does SIGTERM (a scheduler's preemption),
which torchrun handles as before: it passes the signal on to the workers, which
checkpoint and stop, and then raises it in its own main loop; this process
exits with status 128 + 15 instead of printing that.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

from harness.cli.usage import HELP_FLAGS, PRINTING_FLAGS, USAGE_ERROR

INTERRUPTED = 128 + signal.SIGINT  # the shell's convention for "ended by Ctrl-C"
# The agent's loggers of its workers' exits.
WORKER_EXITS = "torch.distributed.elastic.multiprocessing"
_presses: list[int] = []


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (torchrun's workers), from /proc."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # it ended while we looked
            continue
        # "pid (command) state ppid ...": the command may hold spaces and parentheses.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _on_sigint(signum: int, frame: object) -> None:
    _presses.append(signum)
    workers = children(os.getpid())
    for pid in workers:
        try:
            os.kill(pid, signal.SIGINT if len(_presses) == 1 else signal.SIGKILL)
        except ProcessLookupError:  # it ended meanwhile
            pass
    # The agent may report the workers' exit; after a Ctrl-C that is expected, not news.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    if len(_presses) > 1 or not workers:  # a second press, or nothing started yet to stop cleanly
        os._exit(INTERRUPTED)


def torchrun_arguments(argv: list[str]) -> list[str]:
    """``argv`` with SIGINT taken out of the signals torchrun handles, unless the caller chose
    them."""
    if any(a.startswith(("--signals-to-handle", "--signals_to_handle")) for a in argv):
        return argv
    return ["--signals-to-handle=SIGTERM,SIGHUP,SIGQUIT", *argv]


class HeldWorkerExits(logging.Filter):
    """What torchrun's agent says of its workers' exits, held until the job has ended. After a
    mistake in the command (every rank exits with status 2; rank 0 has said what it was) it is noise
    that lists the healthy ranks as failed ones. A worker that fails otherwise (a crash, a SIGKILL)
    is news at once, as torchrun says it: under ``--max-restarts`` the job goes on, and its log
    must name the death when it happened, not at the job's end."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[logging.LogRecord] = []
        self.releasing = False
        self.handlers: list[logging.Handler] = []
        logger: logging.Logger | None = logging.getLogger(WORKER_EXITS)
        while logger is not None:  # the handlers its records reach
            self.handlers += logger.handlers
            logger = logger.parent if logger.propagate else None
        for handler in self.handlers:
            handler.addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.releasing or not record.name.startswith(WORKER_EXITS):
            return True
        self.held.append(record)
        if failure_exit_code(record) not in (None, USAGE_ERROR):
            self.show_held()
        return False

    def show_held(self) -> None:
        """Pass on what is held, in order, and hold what comes after."""
        held, self.held, self.releasing = self.held, [], True
        try:
            for record in held:
                logging.getLogger(record.name).handle(record)
        finally:
            self.releasing = False

    def release(self) -> None:
        for handler in self.handlers:
            handler.removeFilter(self)
        self.show_held()


def failure_exit_code(record: logging.LogRecord) -> int | None:
    """The exit status in the agent's ``failed (exitcode: N) local_rank: ...`` line; None for its
    other lines."""
    if isinstance(record.msg, str) and record.msg.startswith("failed (exitcode: ") and record.args:
        code = record.args[0] if isinstance(record.args, tuple) else None
        return code if isinstance(code, int) else None
    return None


def single_process(argv: list[str]) -> list[str] | None:
    """``python -m <module> <its arguments>`` where torchrun would start a harness entry point only
    to print (``--help``, ``--cfg job``): once, at once. None: launch the job."""
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args(argv)
    printing = any(a in HELP_FLAGS + PRINTING_FLAGS for a in args.training_script_args)
    if args.module and args.training_script.startswith("harness.") and printing:
        return [sys.executable, "-m", args.training_script, *args.training_script_args]
    return None


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv``; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if (command := single_process(argv)) is not None:
        os.execv(command[0], command)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _on_sigint)
    held = HeldWorkerExits()
    try:
        torchrun(torchrun_arguments(argv))
    except SignalException as e:
        # A scheduler's stop (SIGTERM on preemption): the agent passed it on to the workers, which
        # checkpoint at their next safe point and say so, then raises it here. It is not a failure
        # to report with a traceback; the status says which signal ended the job.
        return 128 + int(e.sigval)
    except Exception as e:
        if _presses:  # workers stopped by Ctrl-C during start-up: the agent calls that a failure
            return INTERRUPTED
        if isinstance(e, ChildFailedError) and any(
            f.exitcode == USAGE_ERROR for f in e.failures.values()
        ):
            return USAGE_ERROR  # a mistake in the command, which rank 0 has said
        held.release()
        raise
    held.release()
    return INTERRUPTED if _presses else 0


if __name__ == "__main__":
    sys.exit(main())
