"""The verbs that start a job's processes: ``harness train``, ``harness dataset``, ``harness join``.

    harness train                                   # 3 processes: 1 trainer + 2 collectors
    harness train --nproc 1 debug=tiny              # one process: python -m harness.train
    harness train --nproc 5 --max-restarts 2 sync=shm
    harness train --nnodes 2 --node-rank 0 --rdzv-endpoint host:29500 --rdzv-backend c10d
    harness dataset env=pendulum out=datasets/pendulum-random frames=50000
    harness join --nproc 4 HOST:PORT

``--nproc 1`` runs the entry point in this process, as ``python -m <module>`` would: one process,
in a debugger's reach. More start torchrun's ranks through :mod:`harness.cli.launch` (a quiet
Ctrl-C, one voice per mistake), ``--standalone`` on this machine unless a rendezvous flag says
where the job meets. torchrun's other flags pass on to it; every other word (``key=value``,
Hydra's ``-m`` and ``--cfg job``, ``HOST:PORT``) goes to the entry point. Every process gets
``OMP_NUM_THREADS=1`` unless it is set (as ``scripts/train.sh`` always did).
"""

from __future__ import annotations

import difflib
import os
import runpy
import sys
from dataclasses import dataclass
from typing import NoReturn

from harness.cli.usage import HELP_FLAGS, UsageError

# Hydra's own flags: they go to the entry point, with their values (``--cfg job``).
HYDRA_FLAGS = frozenset(
    {
        *HELP_FLAGS,
        "--hydra-help",
        "--version",
        "--cfg",
        "-c",
        "--resolve",
        "--package",
        "-p",
        "--run",
        "-r",
        "--multirun",
        "-m",
        "--shell-completion",
        "-sc",
        "--config-path",
        "-cp",
        "--config-name",
        "-cn",
        "--config-dir",
        "-cd",
        "--experimental-rerun",
        "--info",
        "-i",
    }
)
NPROC_FLAGS = ("--nproc", "--nproc-per-node", "--nproc_per_node")
# torchrun's flags that choose what runs: the verb does.
CHOSEN = frozenset({"--help", "--module", "--no-python", "--no_python", "--run-path", "--run_path"})
# Flags that say where a job's nodes meet: without any, the job is --standalone on this machine.
RENDEZVOUS = ("--standalone", "--nnodes", "--rdzv", "--master", "--node-rank", "--node_rank")


@dataclass(frozen=True)
class Entry:
    """A verb that starts ``module``'s processes."""

    verb: str
    module: str
    nproc: int  # the processes a launch without --nproc starts
    counts: str  # what a number of processes means, for --nproc's message
    passes: frozenset[str]  # flags that go to the module
    about: str  # --help's text before the module's own


TRAIN = Entry(
    "train",
    "harness.train",
    3,
    "1: one process trains and collects; 3: 1 trainer + 2 collectors",
    HYDRA_FLAGS,
    """\
usage: harness train [--nproc N] [--max-restarts K] [torchrun's flags] [overrides]

  --nproc N          processes on this node (default 3: 1 trainer + 2 collectors);
                     1: one process that trains and collects, without torchrun (a debugger's reach)
  --max-restarts K   torchrun restarts the job up to K times after a rank dies (default 0)
  torchrun's flags   --nnodes, --node-rank, --rdzv-endpoint, ...: passed on; without one that
                     says where the nodes meet, the job is --standalone on this machine
Ctrl-C: checkpoint at the next safe point and stop (it says how to resume); twice: stop at once.
""",
)
DATASET = Entry(
    "dataset",
    "harness.cli.dataset",
    1,
    "1: one process writes it; N: N processes write a share each",
    HYDRA_FLAGS,
    """\
usage: harness dataset [--nproc N] [torchrun's flags] key=value...

  --nproc N          processes that write a share of the frames each (default 1: no torchrun)
""",
)
JOIN = Entry(
    "join",
    "harness.cli.join",
    1,
    "each process is one collector",
    frozenset(HELP_FLAGS),
    """\
usage: harness join [--nproc N] [torchrun's flags] HOST:PORT

  --nproc N          collectors to start, one per process (default 1: no torchrun)
""",
)


def train(argv: list[str]) -> int:
    """``harness train``."""
    return start(TRAIN, argv)


def dataset(argv: list[str]) -> int:
    """``harness dataset``."""
    return start(DATASET, argv)


def join(argv: list[str]) -> int:
    """``harness join``."""
    return start(JOIN, argv)


def start(entry: Entry, argv: list[str]) -> int:
    """Run ``entry`` as ``argv`` asks: its help, one process here, or torchrun's ranks."""
    nproc, torchrun, rest = split(entry, argv)
    # One intra-op thread per process unless the caller chose: oversubscribed threads make every
    # rank slower when several share a machine (torchrun would set it too, with a warning).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if any(a in HELP_FLAGS for a in rest):
        print(entry.about, flush=True)
        return run_here(entry, rest)
    if nproc == 1 and torchrun:
        raise UsageError(
            f"--nproc 1 runs one process, without torchrun: {' '.join(torchrun)} is torchrun's; "
            "give --nproc 2 or more, or leave it out"
        )
    if nproc == 1:
        return run_here(entry, rest)
    from harness.cli import launch

    flags = launch_flags(nproc, torchrun)
    checked(flags)
    return launch.main([*flags, "-m", entry.module, *rest])


def launch_flags(nproc: int, torchrun: list[str]) -> list[str]:
    """torchrun's flags for ``nproc`` processes: ``torchrun`` as given, ``--standalone`` first
    unless one of them says where the job's nodes meet."""
    standalone = [] if any(a.startswith(RENDEZVOUS) for a in torchrun) else ["--standalone"]
    return [*standalone, f"--nproc-per-node={nproc}", *torchrun]


def split(entry: Entry, argv: list[str]) -> tuple[int, list[str], list[str]]:
    """``(processes, torchrun's flags, the module's arguments)`` of ``argv``."""
    nproc, torchrun, rest = entry.nproc, [], []
    known: dict[str, bool] | None = None  # torchrun's flags, read when the first one comes
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, given, value = arg.partition("=")
        if not arg.startswith("-") or name in entry.passes:
            rest.append(arg)
        elif name in NPROC_FLAGS:
            if not given:
                value, i = value_of(argv, i), i + 1
            nproc = count(entry, name, value)
        else:
            known = known or known_torchrun_flags()
            if name not in known:
                raise UsageError(unknown_flag(entry, name, known))
            if known[name] and not given:
                arg, i = f"{name}={value_of(argv, i)}", i + 1
            torchrun.append(arg)
        i += 1
    return nproc, torchrun, rest


def value_of(argv: list[str], i: int) -> str:
    if i + 1 >= len(argv):
        raise UsageError(f"{argv[i]} takes a value: {argv[i]} VALUE or {argv[i]}=VALUE")
    return argv[i + 1]


def count(entry: Entry, flag: str, value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise UsageError(
            f"{flag} {value}: the number of processes must be a whole number >= 1 ({entry.counts})"
        )
    return int(value)


def known_torchrun_flags() -> dict[str, bool]:
    """torchrun's long flags as its own parser spells them; True where the flag takes a value."""
    from torch.distributed.run import get_args_parser

    return {
        flag: action.nargs != 0
        for action in get_args_parser()._actions
        for flag in action.option_strings
        if flag.startswith("--") and flag not in CHOSEN
    }


def unknown_flag(entry: Entry, name: str, known: dict[str, bool]) -> str:
    flags = [*NPROC_FLAGS, *known, *entry.passes]
    near = difflib.get_close_matches(name, flags, n=1)
    hint = f"; did you mean {near[0]}?" if near else ""
    return f"{name} is not a flag of harness {entry.verb}{hint} (harness {entry.verb} --help)"


def checked(flags: list[str]) -> None:
    """torchrun's own parser reads ``flags`` first, so that a bad value (``--max-restarts x``) is
    one line here rather than torchrun's usage block from the agent."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()

    def refuse(message: str) -> NoReturn:
        raise UsageError(f"{message} (torchrun --help says what each flag takes)")

    parser.error = refuse  # type: ignore[method-assign]
    parser.parse_args([*flags, "-m", "harness"])


def run_here(entry: Entry, args: list[str]) -> int:
    """``python -m <module> <args>``, in this process: the same code a rank of a job runs."""
    sys.argv = [f"harness {entry.verb}", *args]
    runpy.run_module(entry.module, run_name="__main__", alter_sys=True)
    return 0
