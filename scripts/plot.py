#!/usr/bin/env python3
"""Plots from runs and benchmarks.

    scripts/plot.py RUN_DIR [RUN_DIR ...] --out curves.png [--aggregate mean|iqm] scripts/plot.py
    --presets runs/sota --out-dir docs/     # docs/curves-<preset>.png, one per preset
    scripts/plot.py --bench bench-weight_sync.json --out latency.png scripts/plot.sh ...          #
    the same, setting up .venv first if it is missing

Started by a Python other than the repository's ``.venv`` (which
``scripts/train.sh`` sets up, matplotlib included), it runs itself again with
that one.

Learning curves: ``train/episode_return`` (``eval/return`` in runs that log no
training return, offline ones) as lines and ``eval/return``, ``eval/final_return``
as dots, against the run's step (env frames; gradient steps offline) and wall
time. Runs whose configs differ only in the seed and in where they were written
(``harness/metrics/curves.py``: ``NAMING_KEYS``) are one group, in one colour,
labelled by what sets it apart from the other groups (``algo.lr=0.001``), or by
its algorithm and env when it is the only one, with its seeds counted by value:
"(2 seeds: 1, 2)", "(2 runs, seed 1)". Every run is a thin line to its own end;
a group of several runs also gets a thick line, its mean with a ± standard error
band (``--aggregate iqm``: the interquartile mean, band from the 25th to the 75th
percentile), over the steps that all its runs have reached. ``--presets ROOT``
draws one PNG per preset from ``ROOT/<preset>/seed-<n>`` (``scripts/sota_check.py``'s
layout), its seeds one group, runs in progress included.

Benchmarks: the JSON of ``benchmarks/weight_sync.py`` (median latency against
model size per scheme, log-log) or of ``benchmarks/collect.py`` (frames per
second per case).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path


def use_project_venv() -> None:
    """Run again under the repository's .venv, if there is one and this is another Python."""
    venv = Path(__file__).resolve().parents[1] / ".venv"
    if (venv / "bin" / "python").exists() and Path(sys.prefix).resolve() != venv.resolve():
        os.execv(
            str(venv / "bin" / "python"), [str(venv / "bin" / "python"), __file__, *sys.argv[1:]]
        )


use_project_venv()
# This checkout's harness, whatever checkout the venv's editable install names.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
try:
    import matplotlib
except ImportError:
    sys.exit(
        "scripts/plot.py needs matplotlib: run it as scripts/plot.sh, which installs the project first"
    )

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib.figure import Figure  # noqa: E402

from harness.metrics.curves import (  # noqa: E402
    AGGREGATES,
    X_AXES,
    Group,
    Panel,
    RunDataError,
    group_runs,
    load_run,
    panel,
    x_label,
    y_label,
)


def load_groups(run_dirs: list[Path], label: str | None = None) -> list[Group]:
    """The runs in ``run_dirs``, grouped by config (with ``label``: one group of that name)."""
    try:
        runs = [load_run(d) for d in run_dirs]
    except RunDataError as e:
        sys.exit(str(e))
    return group_runs(runs, label)


def draw(
    groups: list[Group], how: str = "mean", title: str | None = None
) -> tuple[Figure, list[list[Panel]]]:
    """The figure of ``groups`` (step and wall-time panels, the legend below them, outside
    both, so that it hides no point), and what each group drew on each panel."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = [[panel(g, x_key, how) for x_key in X_AXES] for g in groups]
    for i, (group, panels) in enumerate(zip(groups, drawn)):
        color = colors[i % len(colors)]
        for ax, p in zip(axes, panels):
            draw_panel(ax, p, color, group.legend if ax is axes[0] else None)
    axes[0].set_xlabel(x_label({r.step for g in groups for r in g.runs}))
    axes[1].set_xlabel("wall time (s)")
    for ax in axes:
        ax.set_ylabel(y_label({g.y_key for g in groups}))
        ax.grid(alpha=0.3)
    several = any(len(g.runs) > 1 for g in groups)
    note = (
        f"thin lines: each run, to its end; thick: {AGGREGATES[how]}, over the range that all of a group's runs reached"
        if several
        else ""
    )
    fig.suptitle("\n".join(t for t in (title or common_title(groups), note) if t), fontsize=10)
    long = max(len(g.legend) for g in groups) > 45
    fig.legend(loc="outside lower center", ncols=1 if long else min(len(groups), 3), fontsize=8)
    return fig, drawn


def draw_panel(ax, p: Panel, color: str, label: str | None) -> None:
    """One group on one panel, with ``label`` on one of its lines (one legend entry per group):
    the aggregate's, or the run's where nothing is aggregated."""
    for i, (x, y) in enumerate(p.runs):
        if p.aggregate is not None:
            ax.plot(x, y, color=color, linewidth=0.8, alpha=0.45)
        else:
            ax.plot(x, y, color=color, linewidth=1.5, label=label if i == 0 else None)
    if p.aggregate is not None:
        a = p.aggregate
        ax.plot(a.x, a.center, color=color, linewidth=2.0, label=label)
        ax.fill_between(a.x, a.low, a.high, color=color, alpha=0.2, linewidth=0)
    for x, y in p.evals:
        ax.plot(x, y, "o", color=color, markersize=3)


def common_title(groups: list[Group]) -> str:
    """The algorithm and env every group shares, if they share one ("" otherwise)."""
    heads = {
        (c.get("algo.name"), c.get("env.id"))
        for g in groups
        for c in [g.runs[0].config]
        if c is not None
    }
    if len(heads) != 1 or len(groups) == 1:
        return ""
    algo, env = heads.pop()
    return f"{algo} on {env}"


def plot_runs(
    run_dirs: list[Path],
    out: Path,
    title: str | None = None,
    label: str | None = None,
    how: str = "mean",
) -> list[Group]:
    """``out``: the runs grouped by config (with ``label``, every run is one group of that name: a
    preset's)."""
    groups = load_groups(run_dirs, label)
    fig, _ = draw(groups, how, title)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return groups


def plot_presets(root: Path, out_dir: Path, how: str = "mean") -> None:
    """``out_dir/curves-<preset>.png`` for every ``root/<preset>`` holding ``seed-*`` run
    directories with rows."""
    drawn = 0
    for preset_dir in sorted(d for d in root.iterdir() if d.is_dir()):
        seeds = sorted(
            d
            for d in preset_dir.glob("seed-*")
            if (d / "metrics.csv").exists()
            and len((d / "metrics.csv").read_text().splitlines()) > 1
        )
        if not seeds:
            continue
        out = out_dir / f"curves-{preset_dir.name}.png"
        plot_runs(seeds, out, preset_dir.name, label=preset_dir.name, how=how)
        print(f"wrote {out}")
        drawn += 1
    if not drawn:
        sys.exit(f"{root} has no <preset>/seed-<n> run directory with metrics rows")


def plot_bench(path: Path, out: Path) -> None:
    rows = json.loads(path.read_text())
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if rows and "scheme" in rows[0]:
        by_scheme = defaultdict(list)
        for r in rows:
            by_scheme[r["scheme"]].append((r["params"], r["median_ms"]))
        for scheme, points in by_scheme.items():
            points.sort()
            style = "--" if scheme in ("memcpy", "gloo_per_param") else "-o"
            ax.plot(*zip(*points), style, label=scheme)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("model parameters (float32, 100 tensors)")
        ax.set_ylabel("publish-to-applied latency, median (ms)")
        ax.legend()
    else:
        ax.barh([r["case"] for r in rows], [r["frames_per_s"] for r in rows])
        ax.set_xlabel("env frames per second")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="*", type=Path, help="run directories")
    parser.add_argument("--bench", type=Path, help="a benchmark JSON instead of runs")
    parser.add_argument(
        "--presets",
        type=Path,
        help="a root of <preset>/seed-<n> run directories: one PNG per preset",
    )
    parser.add_argument("--out", type=Path, help="the PNG to write")
    parser.add_argument(
        "--out-dir", type=Path, default=Path("docs"), help="with --presets: where the PNGs go"
    )
    parser.add_argument(
        "--aggregate",
        choices=list(AGGREGATES),
        default="mean",
        help="a group's thick line: " + "; ".join(f"{k}: {v}" for k, v in AGGREGATES.items()),
    )
    args = parser.parse_args()
    if args.presets:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        plot_presets(args.presets, args.out_dir, args.aggregate)
        return
    if args.out is None:
        parser.error("give --out FILE.png (or --presets ROOT)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.bench:
        plot_bench(args.bench, args.out)
    elif args.runs:
        plot_runs(args.runs, args.out, how=args.aggregate)
    else:
        parser.error("give run directories or --bench FILE.json")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
