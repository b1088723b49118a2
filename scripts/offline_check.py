"""Make a "medium" dataset with the harness, run IQL and CQL on it, write their section of
docs/results.md.

    scripts/offline_check.sh                    # Pendulum (about 15 minutes on 2 cores)
    scripts/offline_check.sh --task hopper      # Hopper (SAC to 1M frames first: a bigger machine)
    scripts/offline_check.sh --seeds 1 2 3
    scripts/offline_check.sh --dataset-seed 2   # a second dataset of the same behaviour policy
    scripts/offline_check.sh --root /tmp/offline --algos cql --out /tmp/offline/results.md
    scripts/offline_check.sh --task hopper --expert-run runs/sota/td3_hopper/seed-2 \
        --behaviour-run runs/sota/td3_hopper/seed-1   # runs made already: no SAC runs
    scripts/offline_check.sh --task hopper --algos cql --seeds 1 2 --jobs 2 \
        --set algo.actor_lr=3e-5 --label lr3e-5   # a variant of a preset, two runs side by side
    scripts/offline_check.sh --task hopper --algos cql --seeds 1 2 --summarize   # the table only

As D4RL's "medium": SAC is trained to expert level (its final policy is the
expert reference); a second SAC run keeps a checkpoint every few hundred
frames, and the first one whose stochastic policy scores inside the task's
band writes the dataset. Then the ``iql_<task>`` and ``cql_<task>`` presets
learn from it through torchrun (1 trainer + NPROC-1 evaluating collectors).
Everything lands in runs/offline/ and datasets/ under ``--root`` (default: the
repository); existing datasets and SAC runs are reused. ``--expert-run`` and
``--behaviour-run`` name finished runs of any online algorithm to use instead
of the two SAC runs: the expert's newest checkpoint, and the behaviour run's
checkpoints as the candidates. ``--dataset-seed N``
(default 1) seeds the dataset's rollouts: the same SAC checkpoint, other
episodes, in ``datasets/<task>-medium-seedN`` (seed 1 keeps ``<task>-medium``).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from harness.data import dataset
from harness.data.format import Meta

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Task:
    env: str
    # the preset of the expert run and of the checkpointed run the behaviour policy comes from
    expert: str
    frames: int  # of the checkpointed run
    every: int  # its checkpoint spacing
    band: tuple[float, float]  # the behaviour return a checkpoint must score to be chosen
    size: int  # the dataset's transitions


TASKS = {
    "pendulum": Task(
        "pendulum", "sac_pendulum", frames=4500, every=256, band=(-700, -400), size=50_000
    ),
    "hopper": Task(
        "hopper", "sac_hopper", frames=400_000, every=10_000, band=(1000, 1800), size=1_000_000
    ),
}


def run(args: list[str], **kw) -> None:
    print("+", " ".join(args), flush=True)
    subprocess.run(args, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True, **kw)


def torchrun(nproc: int, module: str, *overrides: str) -> None:
    run(
        [
            str(BIN / "torchrun"),
            "--standalone",
            f"--nproc_per_node={nproc}",
            "-m",
            module,
            *overrides,
        ]
    )


def behaviour_checkpoint(task: str, nproc: int, runs: Path, expert: Path, medium: Path) -> Path:
    """The first checkpoint of the ``medium`` run whose policy scores inside the task's band
    (training the expert and that run first, with SAC, if they are missing); the choice is kept in
    the run, so that datasets of other seeds come from the same behaviour policy without probing
    again."""
    spec = TASKS[task]
    if not (expert / "checkpoints").exists():
        torchrun(
            nproc,
            "harness.train",
            f"experiment={spec.expert}",
            f"run_dir={expert}",
            "logger.console=false",
        )
    if not (medium / "checkpoints").exists():
        torchrun(
            nproc,
            "harness.train",
            f"experiment={spec.expert}",
            f"run_dir={medium}",
            "logger.console=false",
            f"collector.total_frames={spec.frames}",
            f"checkpoint.every_frames={spec.every}",
            "checkpoint.keep=1000",
        )
    chosen = medium / "behaviour_checkpoint.txt"
    if chosen.exists():
        return medium / "checkpoints" / chosen.read_text().strip()
    low, high = spec.band
    probe = runs / f"{task}-probe"
    for checkpoint in sorted((medium / "checkpoints").glob("step-*")):
        shutil.rmtree(probe, ignore_errors=True)
        torchrun(
            nproc,
            "harness.cli.dataset",
            f"env={spec.env}",
            f"policy={checkpoint}",
            f"out={probe}",
            f"frames={spec.size // 5}",
            "reference.random_return=0",
        )
        behaviour = dataset.load(probe)[1].behaviour_return
        print(f"{checkpoint.name}: behaviour return {behaviour:.1f}", flush=True)
        if low <= behaviour <= high:
            chosen.write_text(checkpoint.name + "\n")
            return checkpoint
    raise SystemExit(
        f"no checkpoint of {medium} scores inside {spec.band}: change the band or the run"
    )


def make_dataset(
    task: str, nproc: int, root: Path, seed: int, expert: Path | None, medium: Path | None
) -> Path:
    """``<root>/datasets/<task>-medium`` (``-seed<N>`` for rollout seeds other than 1), written
    unless it exists."""
    spec = TASKS[task]
    out = root / "datasets" / (f"{task}-medium" if seed == 1 else f"{task}-medium-seed{seed}")
    if (out / "meta.json").exists():
        return out
    runs = root / "runs" / "offline"
    expert, medium = expert or runs / f"{task}-sac-expert", medium or runs / f"{task}-sac-medium"
    checkpoint = behaviour_checkpoint(task, nproc, runs, expert, medium)
    torchrun(
        nproc,
        "harness.cli.dataset",
        f"env={spec.env}",
        f"policy={checkpoint}",
        f"out={out}",
        f"frames={spec.size}",
        f"reference.expert_policy={expert}",
        "reference.episodes=20",
        f"seed={seed}",
    )
    return out


SCORED_AT = (
    10_000,
    50_000,
    100_000,
)  # gradient steps the table gives the normalised score at (where run)


def replace_section(out: Path, section: str) -> None:
    """Put ``section`` (it starts with its ``## `` heading) into ``out`` in place of the section of
    the same heading; table rows of the old section whose first two cells no new row has (another
    algorithm's, or the same one's under another ``--label``) are kept. The rest of the file
    stays."""
    text = out.read_text() if out.exists() else "# Results\n"
    heading = section.strip().splitlines()[0]
    start = text.find("\n" + heading)
    if start < 0:
        out.write_text(text.rstrip("\n") + "\n" + section)
        return
    end = text.find("\n## ", start + 1)
    old, rest = text[start:end] if end >= 0 else text[start:], text[end:] if end >= 0 else ""

    def key(line: str) -> tuple[str, ...]:
        return tuple(cell.strip() for cell in line.strip("|").split("|")[:2])

    new_rows = [
        line
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith(("| algorithm", "| ---"))
    ]
    replaced = {key(r) for r in new_rows}
    kept = [
        line
        for line in old.splitlines()
        if line.startswith("| ")
        and not line.startswith(("| algorithm", "| ---"))
        and key(line) not in replaced
    ]
    if kept:
        section = section.replace(new_rows[0], "\n".join([*kept, new_rows[0]]), 1)
    out.write_text(text[:start] + section + rest)


def evaluations(rows: list[dict]) -> list[tuple[float, float]]:
    """``(gradient steps, eval/return)`` of a metrics.csv's rows that have an evaluation."""
    return [
        (float(r["gradient_steps"]), float(r["eval/return"]))
        for r in rows
        if r.get("eval/return") not in (None, "", "nan")
    ]


def normalised_at(
    rows: list[dict], steps: int, normalized: Callable[[float], float | None]
) -> float:
    """The normalised score of the newest evaluation at or before ``steps`` gradient steps; nan if
    the run had not got that far."""
    if float(rows[-1]["gradient_steps"]) < steps:
        return math.nan
    returns = [e for at, e in evaluations(rows) if at <= steps]
    score = normalized(returns[-1]) if returns else None
    return math.nan if score is None else score


def score(normalised: float | None) -> str:
    """A normalised score as the table shows it; - for none."""
    return "-" if normalised is None else f"{normalised:.1f}"


def offline_row(
    name: str, dataset_name: str, run_dirs: list[Path], meta: Meta, scored_at: tuple[int, ...]
) -> str:
    """One table row from finished run directories: the final return (the mean of each seed's last
    three evaluations), its normalised score, the normalised scores at ``scored_at`` steps, the
    behaviour return and the wall time (``time_s`` of each run's last row, mean over seeds)."""
    tables = [list(csv.DictReader((d / "metrics.csv").open())) for d in run_dirs]
    finals = [statistics.mean([e for _, e in evaluations(rows)][-3:]) for rows in tables]
    mean = statistics.mean(finals)
    spread = f" ± {statistics.stdev(finals):.1f}" if len(finals) > 1 else ""
    at = []
    for steps in scored_at:
        scores = [
            s
            for s in (normalised_at(rows, steps, meta.normalized) for rows in tables)
            if not math.isnan(s)
        ]
        at.append(score(statistics.mean(scores) if scores else None))
    steps_run = int(float(tables[0][-1]["gradient_steps"]))
    verdict = "above" if mean > meta.behaviour_return else "NOT above"
    wall = statistics.mean(float(rows[-1]["time_s"]) for rows in tables)
    return (
        f"| {name} | {dataset_name} | {steps_run:,} | {len(finals)} | {mean:.1f}{spread} | {score(meta.normalized(mean))} | "
        f"{' / '.join(at)} | {meta.behaviour_return:.1f} ({verdict}) | {wall:.0f} s |"
    )


def train_all(runs: list[tuple[Path, list[str]]], nproc: int, jobs: int) -> None:
    """``harness.train`` with each run's overrides, ``jobs`` launches at a time (each 1 trainer +
    NPROC-1 evaluators: on a 2-core machine two offline runs side by side keep both cores busy);
    each one's output goes to ``<run dir>.log``."""
    waiting = list(runs)
    running: list[tuple[subprocess.Popen, str]] = []
    while waiting or running:
        while waiting and len(running) < jobs:
            run_dir, overrides = waiting.pop(0)
            args = [
                str(BIN / "torchrun"),
                "--standalone",
                f"--nproc_per_node={nproc}",
                "-m",
                "harness.train",
                *overrides,
            ]
            print("+", " ".join(args), flush=True)
            log = (run_dir.parent / f"{run_dir.name}.log").open("w")
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            running.append(
                (
                    subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT),
                    log.name,
                )
            )
        done, log_name = running.pop(0)
        if done.wait() != 0:
            raise SystemExit(f"a run failed (exit {done.returncode}): {log_name} says why")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=sorted(TASKS), default="pendulum")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument(
        "--dataset-seed", type=int, default=1, help="seed of the dataset's rollouts (default 1)"
    )
    parser.add_argument(
        "--algos",
        nargs="*",
        choices=("iql", "cql"),
        default=["iql", "cql"],
        help="presets to train on the dataset (none: only make the dataset)",
    )
    parser.add_argument(
        "--gradient-steps", type=int, help="each run's budget (default: the preset's)"
    )
    parser.add_argument(
        "--expert-run",
        type=Path,
        help="a finished run whose final policy is the expert (default: SAC's)",
    )
    parser.add_argument(
        "--behaviour-run",
        type=Path,
        help="a run whose checkpoints are the behaviour candidates (default: SAC's)",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=ROOT,
        help="where datasets/ and runs/offline/ go (default: the repository)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "docs" / "results.md",
        help="the markdown file whose section for this dataset gets the rows of the presets run",
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="runs launched side by side (default 1)"
    )
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="overrides for every run (name them with --label)",
    )
    parser.add_argument(
        "--label", help="the runs' name beside the preset's, in their directories and table rows"
    )
    parser.add_argument(
        "--scored-at",
        type=int,
        nargs="+",
        default=list(SCORED_AT),
        help="gradient steps the table scores at",
    )
    parser.add_argument(
        "--summarize",
        action="store_true",
        help="run nothing: the table from the run directories there are",
    )
    args = parser.parse_args()
    if args.set and not args.label:
        raise SystemExit("--set changes the presets: name the runs with --label")
    nproc = int(os.environ.get("NPROC", 2))
    runs = [r.resolve() if r else None for r in (args.expert_run, args.behaviour_run)]
    for given in filter(None, runs):
        if not (given / "checkpoints").is_dir():
            raise SystemExit(
                f"{given} has no checkpoints/: --expert-run and --behaviour-run take finished run directories"
            )
    data = make_dataset(args.task, nproc, args.root.resolve(), args.dataset_seed, *runs)
    if not args.algos:
        return
    _, meta = dataset.load(data)
    behaviour = meta.sources[0]  # the policy and checkpoint it was written with
    other = (
        "" if args.dataset_seed == 1 else f" --dataset-seed {args.dataset_seed}"
    )  # its runs and section are its own
    suffix = (other and f"-data{args.dataset_seed}") + (f"-{args.label}" if args.label else "")
    run_dirs = {
        algo: [
            args.root.resolve() / "runs" / "offline" / f"{algo}_{args.task}{suffix}-seed{seed}"
            for seed in args.seeds
        ]
        for algo in args.algos
    }
    if not args.summarize:
        launches = []
        for algo, dirs in run_dirs.items():
            for seed, run_dir in zip(args.seeds, dirs):
                overrides = [
                    f"experiment={algo}_{args.task}",
                    f"dataset={data}",
                    f"seed={seed}",
                    f"run_dir={run_dir}",
                ]
                overrides += ["checkpoint.resume=false", "logger.console=false", *args.set]
                overrides += (
                    [f"algo.gradient_steps={args.gradient_steps}"] if args.gradient_steps else []
                )
                launches.append((run_dir, overrides))
        (args.root.resolve() / "runs" / "offline").mkdir(
            parents=True, exist_ok=True
        )  # the runs' logs go beside them
        train_all(launches, nproc, args.jobs)
    episodes = OmegaConf.load(
        run_dirs[args.algos[0]][0] / "config.yaml"
    ).eval.episodes  # the presets' (IQL's and CQL's are the same)
    name = f"{meta.env} medium"
    lines = []
    for algo, dirs in run_dirs.items():
        label = algo.upper() + (f" ({args.label})" if args.label else "")
        lines.append(offline_row(label, name, dirs, meta, tuple(args.scored_at)))
        print(lines[-1], flush=True)
    at = " / ".join(f"{s // 1000}k" for s in args.scored_at)
    section = (
        f"\n## Offline: IQL and CQL on {name}{other and f' (dataset seed {args.dataset_seed})'}\n\n"
        f"Made by `scripts/offline_check.sh --task {args.task}{other}` on {time.strftime('%Y-%m-%d')} (1 trainer + {nproc - 1} evaluating "
        "collector(s) through torchrun, 2-core no-GPU machine).\n"
        f"Dataset `{data.relative_to(ROOT) if data.is_relative_to(ROOT) else data}`: {meta.transitions:,} transitions of a "
        f"{behaviour['algo'].upper()} policy stopped at {behaviour['frames']:,} frames; behaviour return {meta.behaviour_return:.1f}, "
        f"random {meta.random_return:.1f}, expert {meta.expert_return:.1f} (the fully trained policy, deterministic).\n"
        f"Final return: per seed, the mean `eval/return` of the last three evaluations ({episodes} deterministic episodes each); "
        "normalised: `100 * (R - random) / (expert - random)`; at N steps: the newest evaluation by then, mean over seeds "
        "(- where no run got there). Wall time: `time_s` of a run's last row, mean over seeds.\n\n"
        f"| algorithm | dataset | gradient steps | seeds | final return | normalised | normalised at {at} | behaviour return | wall time |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(lines) + "\n"
    )
    replace_section(args.out, section)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
