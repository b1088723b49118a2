"""``harness plot``: learning curves of runs, one PNG per preset, or a benchmark's figure.

    harness plot runs/cartpole                                 # runs/cartpole/curves.png
    harness plot runs/a runs/b --out curves.png [--aggregate iqm]
    harness plot --presets runs/sota --out-dir docs            # docs/curves-<preset>.png
    harness plot --bench bench-weight_sync.json                # bench-weight_sync.png

Runs whose configs differ only in the seed and in where they were written are one group, in one
colour, labelled by what sets it apart from the other groups (``algo.lr=0.001``), or by its
algorithm and env when it is the only one, with its seeds counted by value: "(2 seeds: 1, 2)",
"(2 runs, seed 1)". Every run is a thin line to its own end; a group of several runs also gets a
thick line, its mean with a ± standard error band (``--aggregate iqm``: the interquartile mean,
band from the 25th to the 75th percentile), over the steps that all its runs have reached
(:mod:`harness.plot.curves`). ``--presets ROOT`` draws one PNG per preset from
``ROOT/<preset>/seed-<n>`` (``harness results sota``'s layout), its seeds one group, runs in
progress included. Drawing needs matplotlib, the ``plot`` extra.
"""

from __future__ import annotations

from pathlib import Path

from harness.cli.usage import Parser, UsageError
from harness.plot.curves import AGGREGATES, RunDataError

NEEDS_MATPLOTLIB = (
    "harness plot draws with matplotlib, which the plot extra installs: pip install -e '.[plot]'"
)


def parser() -> Parser:
    p = Parser(prog="harness plot", description=__doc__)
    p.add_argument("runs", nargs="*", type=Path, metavar="RUN_DIR", help="run directories")
    p.add_argument(
        "--bench", type=Path, metavar="FILE.json", help="a benchmark's JSON instead of runs"
    )
    p.add_argument(
        "--presets",
        type=Path,
        metavar="ROOT",
        help="a root of <preset>/seed-<n> run directories: one PNG each",
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="FILE.png",
        help="the PNG to write (default: RUN_DIR/curves.png for one run, curves.png for several, "
        "the JSON's name with .png for --bench)",
    )
    p.add_argument(
        "--out-dir",
        type=Path,
        default=Path("docs"),
        metavar="DIR",
        help="with --presets: where the PNGs go",
    )
    p.add_argument(
        "--aggregate",
        choices=list(AGGREGATES),
        default="mean",
        help="a group's thick line: " + "; ".join(f"{k}: {v}" for k, v in AGGREGATES.items()),
    )
    return p


def main(argv: list[str]) -> int:
    """``harness plot``; a mistake (no run directory there) raises :class:`UsageError`."""
    args = parser().parse_args(argv)
    sources = [bool(args.runs), args.bench is not None, args.presets is not None]
    if sum(sources) != 1:
        raise UsageError("give run directories, --presets ROOT or --bench FILE.json: one of them")
    if args.bench is not None and not args.bench.is_file():
        raise UsageError(f"--bench {args.bench}: no such file (a benchmarks/*.py --json output)")
    try:
        from harness.plot import figures
    except ModuleNotFoundError as e:
        if e.name != "matplotlib":
            raise
        raise SystemExit(f"error: {NEEDS_MATPLOTLIB}") from None
    try:
        if args.presets is not None:
            args.out_dir.mkdir(parents=True, exist_ok=True)
            for written in figures.plot_presets(args.presets, args.out_dir, args.aggregate):
                print(f"wrote {written}")
            return 0
        out = args.out or default_out(args.runs, args.bench)
        out.parent.mkdir(parents=True, exist_ok=True)
        if args.bench is not None:
            figures.plot_bench(args.bench, out)
        else:
            figures.plot_runs(args.runs, out, how=args.aggregate)
    except RunDataError as e:
        raise UsageError(str(e)) from None
    print(f"wrote {out}")
    return 0


def default_out(runs: list[Path], bench: Path | None) -> Path:
    if bench is not None:
        return bench.with_suffix(".png")
    return runs[0] / "curves.png" if len(runs) == 1 else Path("curves.png")
