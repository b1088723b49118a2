"""The figures ``harness plot`` writes, drawn with matplotlib (the ``plot`` extra).

Learning curves: ``train/episode_return`` (``eval/return`` in runs that log no training return,
offline ones) as lines and ``eval/return``, ``eval/final_return`` as dots, against the run's step
(env frames; gradient steps offline) and wall time, one group of runs per colour
(:mod:`harness.plot.curves` groups and labels them). Every run is a thin line to its own end; a
group of several runs also gets a thick line, its aggregate with a band, over the steps that all
its runs have reached. Benchmarks: the JSON of ``benchmarks/weight_sync.py`` (median latency
against model size per scheme, log-log) or of ``benchmarks/collect.py`` (frames per second per
case).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display: chosen before pyplot is imported
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from harness.plot.curves import (
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
        f"thin lines: each run, to its end; thick: {AGGREGATES[how]}, "
        "over the range that all of a group's runs reached"
        if several
        else ""
    )
    fig.suptitle("\n".join(t for t in (title or common_title(groups), note) if t), fontsize=10)
    long = max(len(g.legend) for g in groups) > 45
    fig.legend(loc="outside lower center", ncols=1 if long else min(len(groups), 3), fontsize=8)
    return fig, drawn


def draw_panel(ax: Axes, p: Panel, color: str, label: str | None) -> None:
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
    preset's). A directory that is not a run raises :class:`RunDataError`, naming it."""
    groups = group_runs([load_run(d) for d in run_dirs], label)
    fig, _ = draw(groups, how, title)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return groups


def plot_presets(root: Path, out_dir: Path, how: str = "mean") -> list[Path]:
    """``out_dir/curves-<preset>.png`` for every ``root/<preset>`` holding ``seed-*`` run
    directories with rows (``harness results sota``'s layout); returns the files written."""
    if not root.is_dir():
        raise RunDataError(f"{root} is not a directory: --presets takes <root>/<preset>/seed-<n>")
    written = []
    for preset_dir in sorted(d for d in root.iterdir() if d.is_dir()):
        seeds = sorted(
            d
            for d in preset_dir.glob("seed-*")
            if (d / "metrics.csv").exists()
            and len((d / "metrics.csv").read_text().splitlines()) > 1
        )
        if seeds:
            out = out_dir / f"curves-{preset_dir.name}.png"
            plot_runs(seeds, out, preset_dir.name, label=preset_dir.name, how=how)
            written.append(out)
    if not written:
        raise RunDataError(f"{root} has no <preset>/seed-<n> run directory with metrics rows")
    return written


def plot_bench(path: Path, out: Path) -> None:
    """A benchmark's JSON: latency against model size per weight sync scheme, or frames per second
    per collection case."""
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
    plt.close(fig)
