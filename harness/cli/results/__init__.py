"""``harness results``: the score tables of docs/results.md, made from run directories.

    harness results sota [--only PRESET ...] [--seeds N ...] [--frames N] [--summarize] ...
    harness results offline [--recipe NAME] [--dataset-seed N] [--algos bc iql cql] ...
                            [--seeds N ...] [--label NAME key=value ...]

``sota`` (:mod:`harness.cli.results.sota`) runs the online presets over seeds and compares their
final returns with the published ones; ``offline`` (:mod:`harness.cli.results.offline`) makes a
dataset by D4RL's recipe and scores BC, IQL and CQL on it. Both only read the run directories with
``--summarize``. docs/results.md says how each column is read.
"""

from __future__ import annotations

from harness.cli.usage import Parser, UsageError, split_overrides


def parser() -> Parser:
    from harness.cli.results import offline, sota

    p = Parser(prog="harness results", description=__doc__)
    verbs = p.add_subparsers(dest="table", required=True, metavar="sota|offline")
    for name, module in (("sota", sota), ("offline", offline)):
        verb = verbs.add_parser(name, help=module.SUMMARY, description=module.__doc__)
        module.add_arguments(verb)
    return p


def main(argv: list[str]) -> int:
    """``harness results sota|offline ...``; a mistake raises :class:`UsageError`."""
    from harness.cli.results import offline, sota

    flags, overrides = split_overrides(argv)
    args = parser().parse_args(flags)
    if args.table == "offline":
        return offline.run_check(args, overrides)
    if overrides:
        raise UsageError(
            f"harness results sota takes no key=value settings ({' '.join(overrides)}): "
            "its presets are the ones it compares with published scores"
        )
    return sota.run(args)
