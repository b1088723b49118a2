"""Learning curves of several runs, grouped by configuration: what ``harness plot`` draws.

A run is a directory the harness wrote: ``config.yaml`` and ``metrics.csv``, whose step column
is ``frames`` (env frames), or ``gradient_steps`` in runs of offline algorithms (iql, cql), as the
trainer names it. Runs whose configs are equal but for the seed and the names of where they were
written (:data:`NAMING_KEYS`) are one group. A group's label says what sets it apart from the other
groups, its seeds are counted by value (two runs of seed 1 are two runs, not two seeds), each run
is drawn to its own end, and the group's aggregate (mean ± standard error, or the interquartile
mean) covers only the steps that every run of the group has reached.
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
from omegaconf import OmegaConf

from harness.metrics.flat import flat

# Where a run went and what it is called, not how it learns: runs that differ only here are one
# group.
NAMING_KEYS = frozenset(
    {
        "seed",
        "run_dir",
        "run_name",
        "runs_root",
        "logger.name",
        "logger.group",
        "logger.tags",
        "logger.project",
        "logger.entity",
    }
)
STEP_COLUMNS = ("frames", "gradient_steps")  # the trainer's step column: online runs, offline runs
STEP_LABELS = {"frames": "env frames", "gradient_steps": "gradient steps (offline)"}
AGGREGATES = {
    "mean": "mean ± standard error",
    "iqm": "interquartile mean, band from the 25th to the 75th percentile",
}
EVAL_KEYS = (
    "eval/return",
    "eval/final_return",
)  # the collectors' evaluations, and the final weights' in the last row
X_AXES = ("step", "time_s")  # the two panels: the run's step column, wall time

Series = tuple[np.ndarray, np.ndarray]


class RunDataError(ValueError):
    """A directory that cannot be plotted as a run; the message names it and says why."""


@dataclass(frozen=True)
class Run:
    """One run directory's metrics, and its config without :data:`NAMING_KEYS` (None: no
    config.yaml)."""

    path: Path
    step: str  # the step column: "frames", or "gradient_steps" offline
    columns: dict[str, np.ndarray]
    config: Optional[dict[str, object]]
    seed: object = None

    def series(self, x_key: str, y_key: str) -> Series:
        """The rows where ``y_key`` was logged, as (x, y); ``x_key`` "step" is the run's step
        column."""
        x = self.columns.get(self.step if x_key == "step" else x_key)
        y = self.columns.get(y_key)
        if x is None or y is None:
            return np.array([]), np.array([])
        ok = np.isfinite(x) & np.isfinite(y)
        return x[ok], y[ok]


@dataclass(frozen=True)
class Curve:
    """An aggregate over a group's runs on a common x grid: the centre line and its band."""

    x: np.ndarray
    center: np.ndarray
    low: np.ndarray
    high: np.ndarray


@dataclass
class Group:
    """Runs of one configuration. ``label`` says what sets it apart from the other groups."""

    label: str
    runs: list[Run]

    @property
    def legend(self) -> str:
        seeds = describe_seeds([r.seed for r in self.runs])
        return f"{self.label} ({seeds})" if seeds else self.label

    @property
    def y_key(self) -> str:
        """The line: training returns; evaluation returns in runs that log none (offline runs)."""
        trained = any(
            np.isfinite(r.columns.get("train/episode_return", np.array([]))).any()
            for r in self.runs
        )
        return "train/episode_return" if trained else "eval/return"


@dataclass(frozen=True)
class Panel:
    """What one group draws against one x axis: each run to its own end, the evaluation points,
    and the aggregate over the range every run reaches (None for a single run)."""

    runs: list[Series]
    evals: list[Series]
    aggregate: Optional[Curve]


def panel(group: Group, x_key: str, how: str = "mean") -> Panel:
    """``group`` against ``x_key`` (one of :data:`X_AXES`), aggregated by ``how``."""
    runs = [r.series(x_key, group.y_key) for r in group.runs]
    evals = [r.series(x_key, key) for r in group.runs for key in EVAL_KEYS]
    return Panel(
        runs, [s for s in evals if len(s[0])], aggregate(runs, how) if len(runs) > 1 else None
    )


def load_run(run_dir: Path) -> Run:
    """The run in ``run_dir``; :class:`RunDataError` when it has no metrics rows."""
    metrics = run_dir / "metrics.csv"
    if not metrics.exists():
        raise RunDataError(f"{run_dir} has no metrics.csv: is it a run directory?")
    with metrics.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise RunDataError(
            f"{metrics} has no rows yet: a run writes one every logger.log_every_frames frames"
        )
    step = next((c for c in STEP_COLUMNS if c in rows[0]), None)
    if step is None:
        raise RunDataError(
            f"{metrics} has no step column ({' or '.join(STEP_COLUMNS)}): it is not a harness run's"
        )
    columns = {
        k: np.array([float(r[k]) if r.get(k) not in (None, "") else np.nan for r in rows])
        for k in rows[0]
    }
    if not (run_dir / "config.yaml").exists():
        return Run(run_dir, step, columns, None)
    # Unresolved: config.yaml keeps ${oc.env:...} secrets as written, and they need not resolve
    # here.
    tree = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=False)
    # Lists as tuples: comparable and printable.
    settings = {
        k: tuple(v) if isinstance(v, list) else v
        for k, v in flat(tree if isinstance(tree, dict) else {}).items()
    }
    config = {k: v for k, v in settings.items() if k not in NAMING_KEYS}
    return Run(run_dir, step, columns, config, settings.get("seed"))


def describe_seeds(seeds: list) -> str:
    """ "2 seeds: 1, 2"; "2 runs, seed 1" (the same seed twice is not two seeds); "" for one run of
    unknown seed."""
    counts = Counter("?" if s is None else s for s in seeds)
    order = sorted(
        counts, key=lambda s: (0, s, "") if isinstance(s, (int, float)) else (1, 0, str(s))
    )
    if len(seeds) == 1:
        return "" if seeds[0] is None else f"seed {seeds[0]}"
    if len(counts) == len(seeds):
        return f"{len(seeds)} seeds: {', '.join(map(str, order))}"
    if len(counts) == 1:
        return f"{len(seeds)} runs, seed {order[0]}"
    named = ", ".join(f"{s} ({counts[s]} runs)" if counts[s] > 1 else str(s) for s in order)
    return f"{len(seeds)} runs, {len(counts)} seeds: {named}"


def group_runs(runs: list[Run], label: Optional[str] = None) -> list[Group]:
    """Runs of equal configs (but for :data:`NAMING_KEYS`) as groups, in the order first met;
    with ``label``, all of them one group of that name (a preset's seeds). A run without a
    config.yaml is a group of its own, named by its directory."""
    if label is not None:
        return [Group(label, list(runs))] if runs else []
    configs: list[Optional[dict[str, object]]] = []
    members: list[list[Run]] = []
    for run in runs:
        same = [i for i, c in enumerate(configs) if run.config is not None and c == run.config]
        if same:
            members[same[0]].append(run)
        else:
            configs.append(run.config)
            members.append([run])
    labels = group_labels(configs)
    return [Group(lab or m[0].path.name, m) for lab, m in zip(labels, members)]


def group_labels(configs: list[Optional[dict[str, object]]]) -> list[str]:
    """What sets each config apart from the others: its algorithm and env where those differ, and
    ``key=value`` for every other key that differs (``algo.*`` keys among configs of the same
    algorithm only: another algorithm's hyper-parameters are not a difference worth naming).
    One config: its algorithm and env. "" for a missing config (the caller names it)."""
    known = [c for c in configs if c is not None]
    if len(known) == 1:
        return [head(c) if c is not None else "" for c in configs]
    labels = []
    for config in configs:
        if config is None:
            labels.append("")
            continue
        parts = [str(config.get(k)) for k in ("algo.name", "env.id") if differs(k, known)]
        keys = sorted(set().union(*known) - {"algo.name", "env.id"})
        for key in keys:
            peers = (
                [c for c in known if c.get("algo.name") == config.get("algo.name")]
                if key.startswith("algo.")
                else known
            )
            if differs(key, peers):
                parts.append(f"{key}={show(config.get(key, '(unset)'))}")
        labels.append(" ".join(parts) or head(config))
    return labels


def head(config: dict[str, object]) -> str:
    """A config's algorithm and env: "ppo CartPole-v1"."""
    return f"{config.get('algo.name', '?')} {config.get('env.id', '?')}"


def differs(key: str, configs: list[dict[str, object]]) -> bool:
    missing = object()
    return len({repr(c.get(key, missing)) for c in configs}) > 1


def show(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, tuple):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def aggregate(series: list[Series], how: str = "mean", points: int = 200) -> Optional[Curve]:
    """The runs' ``how`` (a key of :data:`AGGREGATES`) on a grid over the x range that every run
    covers, each run interpolated onto it; None when some run has no points or they share no
    range."""
    if how not in AGGREGATES:
        raise ValueError(f"aggregate {how!r}: choose one of {', '.join(AGGREGATES)}")
    if not series or any(len(x) == 0 for x, _ in series):
        return None
    start, end = max(float(x.min()) for x, _ in series), min(float(x.max()) for x, _ in series)
    if start > end:
        return None
    grid = np.linspace(start, end, points) if end > start else np.array([start])
    curves = np.array([np.interp(grid, x, y) for x, y in series])
    if how == "iqm":
        low, high = np.percentile(curves, [25, 75], axis=0)
        return Curve(grid, interquartile_mean(curves), low, high)
    center = curves.mean(axis=0)
    spread = (
        curves.std(axis=0, ddof=1) / np.sqrt(len(curves))
        if len(curves) > 1
        else np.zeros_like(center)
    )
    return Curve(grid, center, center - spread, center + spread)


def interquartile_mean(curves: np.ndarray) -> np.ndarray:
    """Per column, the mean of the middle half of the runs: ``int(n / 4)`` cut from each end, as
    rliable's IQM (``scipy.stats.trim_mean(..., 0.25)``); with fewer than four runs, the mean."""
    ordered = np.sort(curves, axis=0)
    cut = int(0.25 * len(ordered))
    return ordered[cut : len(ordered) - cut].mean(axis=0)


def x_label(steps: set[str]) -> str:
    """The step panel's x label, for the step columns of the runs drawn on it."""
    if len(steps) == 1:
        return STEP_LABELS[next(iter(steps))]
    return "env frames (online runs) / gradient steps (offline runs)"


def y_label(y_keys: set[str]) -> str:
    if y_keys == {"eval/return"}:
        return "evaluation return (lines and dots)"
    if y_keys == {"train/episode_return"}:
        return "episode return (lines: training; dots: evaluation)"
    return "episode return (lines: training, evaluation for runs without; dots: evaluation)"
