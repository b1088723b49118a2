"""The ``harness`` command: one front door, a verb for each thing the harness does.

    harness train [--nproc N] [torchrun's flags] [overrides]     (harness.cli.jobs)
    harness evaluate RUN_DIR [key=value ...]                     (harness.cli.evaluate)
    harness join [--nproc N] HOST:PORT                           (harness.cli.jobs)
    harness dataset [--nproc N] key=value ...                    (harness.cli.jobs)
    harness plot RUN_DIR ... [--out FILE]                        (harness.cli.plot)
    harness results sota|offline [...]                           (harness.cli.results)
    harness gpu-check [--out DIR] [--dry-run]                    (harness.cli.gpu_check)

``python -m harness`` is the same command. Each verb's module is imported only when it runs, after
a Ctrl-C has been made quiet: torch and Hydra take seconds to import, and a Ctrl-C in them ends
the command at once, without a traceback. A mistake in the command line is one line,
``error: ...``, and exit status 2 (:mod:`harness.cli.usage`).
"""

from __future__ import annotations

import difflib
import sys
from importlib import import_module

from harness.distributed import signals

# verb: (module, function, what it does)
VERBS = {
    "train": ("harness.cli.jobs", "train", "train a policy: 1 trainer + 2 collectors by default"),
    "evaluate": ("harness.cli.evaluate", "main", "play a run's checkpoint, print its return"),
    "join": ("harness.cli.jobs", "join", "add collectors to a running job"),
    "dataset": ("harness.cli.jobs", "dataset", "write an offline dataset from a policy's rollouts"),
    "plot": ("harness.cli.plot", "main", "learning curves of runs, or a benchmark's figure"),
    "results": ("harness.cli.results", "main", "the score tables of docs/results.md"),
    "gpu-check": ("harness.cli.gpu_check.prepare", "main", "the harness on a GPU, in one table"),
}
HELP = "usage: harness VERB [arguments]   (harness VERB --help: the verb's own)\n\n" + "\n".join(
    f"  {verb:<10} {about}" for verb, (_, _, about) in VERBS.items()
)


def main(argv: list[str] | None = None) -> int:
    """Run the verb ``argv`` names; returns the exit status."""
    signals.quiet_interrupt()  # first: every import below may take seconds
    from harness.cli.usage import command

    argv = sys.argv[1:] if argv is None else argv
    return command(dispatch, argv)


def dispatch(argv: list[str]) -> int:
    from harness.cli.usage import HELP_FLAGS, UsageError

    if argv and argv[0] in (*HELP_FLAGS, "help"):
        print(HELP, flush=True)
        return 0
    if not argv:
        raise UsageError(f"give a verb: {', '.join(VERBS)} (harness --help says what each does)")
    verb, args = argv[0], argv[1:]
    if verb not in VERBS:
        near = difflib.get_close_matches(verb, VERBS, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise UsageError(f"{verb} is not a verb of harness{hint}; the verbs: {', '.join(VERBS)}")
    module, function, _ = VERBS[verb]
    return int(getattr(import_module(module), function)(args))
