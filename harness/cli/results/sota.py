"""``harness results sota``: run the SOTA presets over seeds and write the table of docs/results.md.

    harness results sota                                     # every preset, full budget, seed 1
    harness results sota --only ppo_halfcheetah --seeds 1 2 3
    harness results sota --only td3_hopper --frames 300000   # capped: the table says so
    harness results sota --summarize --runs-root runs/sota   # only read run directories

Each preset and seed runs through torchrun (1 trainer + the collectors its settings are for: 2 for
``ppo_cartpole`` and the Atari presets, 1 for the others; ``--nproc N`` starts N processes for
every preset; ``ppo_atari_pong`` is ``experiment=ppo_atari env=pong``) in
``<runs-root>/<preset>/seed-<n>`` (default runs-root: runs/sota). The same command on an
unfinished run directory resumes it; ``--start-over`` moves an earlier run aside first. Runs
launched some other way (``torchrun ... -m harness.train experiment=<preset> seed=<n>
run_dir=<runs-root>/<preset>/seed-<n>``) are summarised the same way: the table is made from each
run directory's ``metrics.csv`` (and its ``config.yaml`` for the budget), so ``--summarize`` also
reports runs still in progress, marked as such, with the return of their newest rows.

Per seed, the final return is the mean ``eval/return`` of the last two evaluations where the
preset evaluates, else the mean ``train/episode_return`` of the last three log rows; the wall time
is ``time_s`` of the last row. How fast a run gets there is in the column of training returns (the
same mean of three rows) at 25%, 50% and 100% of the budget.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from harness.cli.results.published import PRESETS

ROOT = Path(__file__).resolve().parents[3]  # the checkout: runs/sota and docs/results.md
SUMMARY = "run the online presets over seeds; their table in docs/results.md"


@dataclass
class Run:
    """What one run directory's metrics.csv (and config.yaml) say."""

    seed: str
    frames: int  # frames of the last row
    budget: int | None  # collector.total_frames from config.yaml; None without one
    final: float
    source: str  # eval or train
    train: float  # train_return's
    wall_s: float
    # train_return at 25%, 50% and 100% of the budget (nan before the run gets there)
    progress: tuple[float, ...]

    @property
    def finished(self) -> bool:
        return self.budget is not None and self.frames >= self.budget


def logged(rows: list[dict], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r.get(key) not in (None, "", "nan")]


def final_return(rows: list[dict]) -> tuple[float, str]:
    """The mean of the last two evaluations, the final weights' last where the
    run logged it (``eval/final_return``); without evaluations, :func:`train_return`."""
    evals = logged(rows, "eval/return") + logged(rows, "eval/final_return")[-1:]
    if evals:
        return statistics.mean(evals[-2:]), "eval"
    return train_return(rows), "train"


def train_return(rows: list[dict]) -> float:
    """The mean training return of the last three rows: the stochastic policy's episodes, as CleanRL
    reports."""
    train = logged(rows, "train/episode_return")
    return statistics.mean(train[-3:]) if train else math.nan


PROGRESS = (0.25, 0.5, 1.0)  # shares of the budget the table reports the training return at


def progress(rows: list[dict], budget: int) -> tuple[float, ...]:
    """:func:`train_return` of the rows up to each share of ``budget`` in :data:`PROGRESS`; nan for
    a share the run has not reached. Rows end on whole batches, so a share's rows and its reach are
    taken within 1% of the budget."""
    last, slack = float(rows[-1]["frames"]), budget / 100
    return tuple(
        train_return([r for r in rows if float(r["frames"]) <= share * budget + slack])
        if last >= share * budget - slack
        else math.nan
        for share in PROGRESS
    )


def budget_of(run_dir: Path) -> int | None:
    """``collector.total_frames`` as the run's config.yaml has it; None without one."""
    config = run_dir / "config.yaml"
    return int(OmegaConf.load(config).collector.total_frames) if config.exists() else None


def read_run(run_dir: Path) -> Run | None:
    """The run in ``run_dir``, or None while it has no metrics row."""
    metrics = run_dir / "metrics.csv"
    rows = list(csv.DictReader(metrics.open())) if metrics.exists() else []
    if not rows:
        return None
    final, source = final_return(rows)
    seed = run_dir.name.removeprefix("seed-")
    frames, wall_s = int(float(rows[-1]["frames"])), float(rows[-1]["time_s"])
    budget = budget_of(run_dir)
    return Run(
        seed,
        frames,
        budget,
        final,
        source,
        train_return(rows),
        wall_s,
        progress(rows, budget or frames),
    )


def seed_dirs(runs_root: Path, preset: str, seeds: list[int] | None) -> list[Path]:
    """``<runs_root>/<preset>/seed-<n>`` for ``seeds``, or every such directory there is."""
    if seeds is not None:
        return [runs_root / preset / f"seed-{s}" for s in seeds]
    found = (runs_root / preset).glob("seed-*")
    return sorted((d for d in found if d.is_dir()), key=lambda d: (len(d.name), d.name))


def summary_row(preset: str, runs: list[Run]) -> str:
    """One table row: budget, seeds, final return over seeds, published score and budget, wall time,
    notes."""
    pub = PRESETS[preset]
    finals = [r.final for r in runs]
    sources = "/".join(sorted({r.source for r in runs}))
    budgets = sorted({r.budget or r.frames for r in runs})
    notes = []
    if sources != "train":
        notes.append(f"training episodes (as CleanRL reports): {mean_sd([r.train for r in runs])}")
    if max(budgets) < pub.frames:
        notes.append(f"below the published budget: {max(budgets):,} of {pub.frames:,} frames")
    unfinished = [r for r in runs if not r.finished]
    if unfinished:
        notes.append(
            "in progress or stopped: "
            + ", ".join(
                f"seed {r.seed} at {r.frames:,}" + (f" of {r.budget:,}" if r.budget else "")
                for r in unfinished
            )
        )
    wall = statistics.mean(r.wall_s for r in runs)
    at_shares = " / ".join(
        mean_over_reached([r.progress[i] for r in runs]) for i in range(len(PROGRESS))
    )
    cells = [
        pub.algo,
        pub.task,
        " / ".join(f"{b:,}" for b in budgets),
        f"{len(runs)} ({', '.join(r.seed for r in runs)})",
        f"{mean_sd(finals)} ({sources})",
        at_shares,
        pub.score,
        short(pub.frames),
        f"{wall:,.0f} s",
        "; ".join(notes),
    ]
    return "| " + " | ".join(cells) + " |"


def mean_sd(values: list[float]) -> str:
    """``mean ± sd`` (n - 1) over seeds; the mean alone for one seed."""
    spread = f" ± {statistics.stdev(values):,.1f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):,.1f}{spread}"


def mean_over_reached(values: list[float]) -> str:
    """:func:`mean_sd` over the seeds that reached a share of the budget (nan: not yet), saying how
    many did."""
    reached = [v for v in values if not math.isnan(v)]
    if not reached:
        return "-"
    return mean_sd(reached) + (
        f" ({len(reached)} of {len(values)} seeds)" if len(reached) < len(values) else ""
    )


def short(frames: int) -> str:
    """1M, 500k: a published budget."""
    return f"{frames / 1e6:g}M" if frames >= 1_000_000 else f"{frames / 1e3:g}k"


def command(
    preset: str,
    seed: int,
    run_dir: Path,
    frames: int | None,
    start_over: bool,
    nproc: int | None = None,
) -> list[str]:
    """The torchrun command line of one preset and seed (``nproc``: the preset's own if None)."""
    cmd = [
        str(Path(sys.executable).parent / "torchrun"),
        "--standalone",
        f"--nproc_per_node={nproc or PRESETS[preset].nproc}",
        "-m",
        "harness.train",
        *(PRESETS[preset].launch or [f"experiment={preset}"]),
        f"seed={seed}",
        f"run_dir={run_dir}",
        "logger.console=false",
    ]
    if frames:
        cmd.append(f"collector.total_frames={frames}")
    if start_over:
        cmd.append("checkpoint.start_over=true")
    return cmd


def launch(cmd: list[str]) -> int:
    """One preset and seed through torchrun; returns its exit status."""
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}).returncode


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--only",
        nargs="+",
        choices=sorted(PRESETS),
        metavar="PRESET",
        help="these presets only: " + ", ".join(sorted(PRESETS)),
    )
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        metavar="N",
        help="seeds to run (default 1) or to summarise (default: every seed-* found)",
    )
    p.add_argument(
        "--frames", type=int, metavar="N", help="cap every preset run at this many frames"
    )
    p.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="torchrun's processes for every preset (default: each preset's)",
    )
    p.add_argument(
        "--runs-root",
        type=Path,
        default=ROOT / "runs" / "sota",
        metavar="DIR",
        help="run directories: <root>/<preset>/seed-<n>",
    )
    p.add_argument(
        "--summarize",
        action="store_true",
        help="run nothing: summarise the run directories there are",
    )
    p.add_argument(
        "--start-over",
        action="store_true",
        help="move an earlier run in a run directory aside first",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=ROOT / "docs" / "results.md",
        metavar="FILE",
        help="the table's markdown file (default: docs/results.md)",
    )


def run(args: argparse.Namespace) -> int:
    """Launch what ``args`` ask for, then write the rows of every preset with runs."""
    failed = []
    lines = []
    for preset in args.only or PRESETS:
        if not args.summarize:
            for seed in args.seeds or [1]:
                run_dir = args.runs_root / preset / f"seed-{seed}"
                cmd = command(preset, seed, run_dir, args.frames, args.start_over, args.nproc)
                if status := launch(cmd):
                    failed.append(f"{preset} seed {seed} (exit {status})")
        runs = [
            run
            for d in seed_dirs(args.runs_root, preset, args.seeds)
            if (run := read_run(d)) is not None
        ]
        if runs:
            lines.append(summary_row(preset, runs))
            print(lines[-1], flush=True)
    write_table(args.out, lines)
    if failed:
        raise SystemExit("failed: " + "; ".join(failed))
    return 0


HEADER = (
    "| algorithm | task | frames (budget) | seeds | final return "
    "| train return at 25% / 50% / 100% | published | "
    "published at | wall time per seed | notes |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)
ABOUT = (
    "Made by `harness results sota` from the run directories `<runs-root>/<preset>/seed-<n>` "
    "(1 trainer + 1\ncollector through torchrun, 2 for PPO CartPole and Atari, on this project's "
    "2-core, no-GPU machine).\n"
)
HOW = (
    "Final return: per seed, the mean of the last two evaluations (deterministic policy; the last "
    "one of the\nfinal weights, `eval/final_return`, where the run logged it) where the preset "
    "evaluates, else the mean\n`train/episode_return` of the last three log rows (the stochastic "
    "policy's training episodes, as CleanRL\nreports); then the mean ± standard deviation (n - 1) "
    "over seeds. Wall time: `time_s` of the last row, mean\nover seeds. A row says when it ran "
    "below the published budget, and when a seed has not reached its budget\n(in progress, or "
    "stopped). How fast: the training return (the same mean of three rows) at 25%, 50% and\n100% "
    "of the budget. Offline presets: below.\n\n"
)


def write_table(out: Path, lines: list[str]) -> None:
    """Replace the rows of the presets just summarised (keyed by algorithm and task),
    keep the others, so partial runs build the table up. Sections from the
    first ``## `` heading on (notes, the offline results) are kept as they are."""

    def key(line: str) -> tuple[str, ...]:
        return tuple(cell.strip() for cell in line.strip("|").split("|")[:2])

    text = out.read_text() if out.exists() else ""
    cut = text.find("\n## ")
    head, sections = (text, "") if cut < 0 else (text[:cut], text[cut:])
    rows = {
        key(line): line
        for line in head.splitlines()
        if line.startswith("| ")
        and not line.startswith("| algorithm")
        and not line.startswith("| ---")
    }
    rows.update({key(line): line for line in lines})
    out.write_text(
        f"# Results\n\n{ABOUT}Last update {time.strftime('%Y-%m-%d')}.\n{HOW}"
        f"{HEADER}\n" + "\n".join(rows.values()) + "\n" + sections
    )
    print(f"wrote {out}")
