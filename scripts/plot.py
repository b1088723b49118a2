#!/usr/bin/env python3
"""Plots from runs and benchmarks.

    scripts/plot.py RUN_DIR [RUN_DIR ...] --out curves.png
    scripts/plot.py --presets runs/sota --out-dir docs/     # docs/curves-<preset>.png, one per preset, seeds as a band
    scripts/plot.py --bench bench-weight_sync.json --out latency.png
    scripts/plot.sh ...          # the same, setting up .venv first if it is missing

Started by a Python other than the repository's ``.venv`` (which
``scripts/train.sh`` sets up, matplotlib included), it runs itself again with
that one.

Learning curves: ``train/episode_return`` (and ``eval/return``, ``eval/final_return`` where logged)
against env frames and against wall time, one line per run. Runs whose
configs differ only in ``seed`` (and ``run_dir``) are one line: their mean,
with a band from the lowest to the highest seed. ``--presets ROOT`` draws one
PNG per preset from ``ROOT/<preset>/seed-<n>`` (``scripts/sota_check.py``'s
layout): the mean over seeds with the min-max band, up to the frames every
seed has reached (runs still in progress included).

Benchmarks: the JSON of ``benchmarks/weight_sync.py`` (median latency against
model size per scheme, log-log) or of ``benchmarks/collect.py`` (frames per
second per case).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import sys
from collections import defaultdict
from pathlib import Path


def use_project_venv() -> None:
    """Run again under the repository's .venv, if there is one and this is another Python."""
    venv = Path(__file__).resolve().parents[1] / ".venv"
    if (venv / "bin" / "python").exists() and Path(sys.prefix).resolve() != venv.resolve():
        os.execv(str(venv / "bin" / "python"), [str(venv / "bin" / "python"), __file__, *sys.argv[1:]])


use_project_venv()
try:
    import matplotlib
except ImportError:
    sys.exit("scripts/plot.py needs matplotlib: run it as scripts/plot.sh, which installs the project first")

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402


def load_run(run_dir: Path) -> tuple[str, dict[str, np.ndarray]]:
    """(label without the seed, columns) of one run directory."""
    metrics = run_dir / "metrics.csv"
    if not metrics.exists():
        sys.exit(f"{run_dir} has no metrics.csv: is it a run directory?")
    rows = list(csv.DictReader(metrics.open()))
    if not rows:
        sys.exit(f"{metrics} has no rows yet: a run writes one every logger.log_every_frames frames")
    columns = {k: np.array([float(r[k]) if r.get(k) not in (None, "") else np.nan for r in rows]) for k in rows[0]}
    label = run_dir.name
    if (run_dir / "config.yaml").exists():
        cfg = OmegaConf.load(run_dir / "config.yaml")
        label = f"{cfg.algo.name} {cfg.env.id} sync={cfg.sync.name}"
        cfg.seed, cfg.run_dir = None, None
        label += f" [{hashlib.sha1(OmegaConf.to_yaml(cfg).encode()).hexdigest()[:6]}]"  # same config, same line
    return label, columns


def plot_runs(run_dirs: list[Path], out: Path, title: str | None = None, label: str | None = None) -> None:
    """One line per config, seeds as a band; with ``label``, every run is a seed of that one line (a preset's)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for run_dir in run_dirs:
        config_label, columns = load_run(run_dir)
        groups[label or config_label].append(columns)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for (label, runs), color in zip(groups.items(), plt.rcParams["axes.prop_cycle"].by_key()["color"] * 10):
        seeds = f" ({len(runs)} seeds)" if len(runs) > 1 else ""
        step = "frames" if "frames" in runs[0] else "gradient_steps"  # offline runs count gradient steps
        y_key = "train/episode_return" if "train/episode_return" in runs[0] else "eval/return"
        for ax, x_key in zip(axes, (step, "time_s")):
            grid = np.linspace(max(r[x_key].min() for r in runs), min(r[x_key].max() for r in runs), 200)
            curves = np.array([np.interp(grid, r[x_key][np.isfinite(r[y_key])], r[y_key][np.isfinite(r[y_key])]) for r in runs])
            ax.plot(grid, curves.mean(0), color=color, label=f"{label}{seeds}")
            if len(runs) > 1:
                ax.fill_between(grid, curves.min(0), curves.max(0), color=color, alpha=0.2)
            for r in runs:  # evaluations: the collectors', and the final weights' in the last row
                for key in ("eval/return", "eval/final_return"):
                    ok = np.isfinite(r[key]) if key in r else []
                    if np.any(ok):
                        ax.plot(r[x_key][ok], r[key][ok], "o", color=color, markersize=3)
    axes[0].set_xlabel("env frames (offline: gradient steps)")
    axes[1].set_xlabel("wall time (s)")
    for ax in axes:
        ax.set_ylabel("episode return (lines: training; dots: evaluation)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def plot_presets(root: Path, out_dir: Path) -> None:
    """``out_dir/curves-<preset>.png`` for every ``root/<preset>`` holding ``seed-*`` run directories with rows."""
    drawn = 0
    for preset_dir in sorted(d for d in root.iterdir() if d.is_dir()):
        seeds = sorted(
            d
            for d in preset_dir.glob("seed-*")
            if (d / "metrics.csv").exists() and len((d / "metrics.csv").read_text().splitlines()) > 1
        )
        if not seeds:
            continue
        names = ", ".join(d.name.removeprefix("seed-") for d in seeds)
        out = out_dir / f"curves-{preset_dir.name}.png"
        plot_runs(seeds, out, f"{preset_dir.name}: mean over seeds {names}, band from min to max", label=preset_dir.name)
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", type=Path, help="run directories")
    parser.add_argument("--bench", type=Path, help="a benchmark JSON instead of runs")
    parser.add_argument("--presets", type=Path, help="a root of <preset>/seed-<n> run directories: one PNG per preset")
    parser.add_argument("--out", type=Path, help="the PNG to write")
    parser.add_argument("--out-dir", type=Path, default=Path("docs"), help="with --presets: where the PNGs go")
    args = parser.parse_args()
    if args.presets:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        plot_presets(args.presets, args.out_dir)
        return
    if args.out is None:
        parser.error("give --out FILE.png (or --presets ROOT)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.bench:
        plot_bench(args.bench, args.out)
    elif args.runs:
        plot_runs(args.runs, args.out)
    else:
        parser.error("give run directories or --bench FILE.json")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
