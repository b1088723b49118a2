"""``harness results offline``: make a "medium" dataset with the harness, run IQL and CQL on it,
write their section of docs/results.md.

    harness results offline                     # Pendulum (about 15 minutes on 2 cores)
    harness results offline --task hopper       # Hopper (SAC to 1M frames first: a bigger machine)
    harness results offline --seeds 1 2 3
    harness results offline --dataset-seed 2    # a second dataset of the same behaviour policy
    harness results offline --root /tmp/offline --algos cql --out /tmp/offline/results.md
    harness results offline --task hopper --expert-run runs/sota/td3_hopper/seed-2 \\
        --behaviour-run runs/sota/td3_hopper/seed-1   # runs made already: no SAC runs
    harness results offline --task hopper --algos cql --seeds 1 2 --jobs 2 \\
        --label lr3e-5 algo.actor_lr=3e-5       # a variant of a preset, two runs side by side
    harness results offline --task hopper --algos cql --seeds 1 2 --summarize   # the table only

As D4RL's "medium": SAC is trained to expert level (its final policy is the expert reference); a
second SAC run keeps a checkpoint every few hundred frames, and the first one whose stochastic
policy scores inside the task's band writes the dataset. Then the ``iql_<task>`` and
``cql_<task>`` presets learn from it through torchrun (1 trainer + ``--nproc`` - 1 evaluating
collectors), with the ``key=value`` overrides given (name such runs with ``--label``).
Everything lands in runs/offline/ and datasets/ under ``--root`` (default: the repository);
existing datasets and SAC runs are reused. ``--expert-run`` and ``--behaviour-run`` name finished
runs of any online algorithm to use instead of the two SAC runs: the expert's newest checkpoint,
and the behaviour run's checkpoints as the candidates. ``--dataset-seed N`` (default 1) seeds the
dataset's rollouts: the same SAC checkpoint, other episodes, in ``datasets/<task>-medium-seedN``
(seed 1 keeps ``<task>-medium``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from harness.cli.results.offline_table import SCORED_AT, offline_row, replace_section, section
from harness.cli.usage import UsageError
from harness.data import dataset
from harness.data.format import Meta

ROOT = Path(__file__).resolve().parents[3]  # the checkout: datasets/, runs/, docs/results.md
BIN = Path(sys.executable).parent
SUMMARY = "a medium dataset, IQL and CQL on it; their section of docs/results.md"


@dataclass(frozen=True)
class Task:
    """Where a task's dataset comes from."""

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


def torchrun(nproc: int, module: str, *overrides: str) -> list[str]:
    """The command line of ``module`` on ``nproc`` torchrun ranks."""
    return [
        str(BIN / "torchrun"),
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        module,
        *overrides,
    ]


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True)


def behaviour_checkpoint(task: str, nproc: int, runs: Path, expert: Path, medium: Path) -> Path:
    """The first checkpoint of the ``medium`` run whose policy scores inside the task's band
    (training the expert and that run first, with SAC, if they are missing); the choice is kept in
    the run, so that datasets of other seeds come from the same behaviour policy without probing
    again."""
    spec = TASKS[task]
    train = ["harness.train", f"experiment={spec.expert}", "logger.console=false"]
    if not (expert / "checkpoints").exists():
        run(torchrun(nproc, *train, f"run_dir={expert}"))
    if not (medium / "checkpoints").exists():
        every = [f"checkpoint.every_frames={spec.every}", "checkpoint.keep=1000"]
        run(
            torchrun(
                nproc, *train, f"run_dir={medium}", f"collector.total_frames={spec.frames}", *every
            )
        )
    chosen = medium / "behaviour_checkpoint.txt"
    if chosen.exists():
        return medium / "checkpoints" / chosen.read_text().strip()
    low, high = spec.band
    probe = runs / f"{task}-probe"
    for checkpoint in sorted((medium / "checkpoints").glob("step-*")):
        shutil.rmtree(probe, ignore_errors=True)
        run(
            torchrun(
                nproc,
                "harness.cli.dataset",
                f"env={spec.env}",
                f"policy={checkpoint}",
                f"out={probe}",
                f"frames={spec.size // 5}",
                "reference.random_return=0",
            )
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
    run(
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
    )
    return out


def train_all(runs: list[tuple[Path, list[str]]], nproc: int, jobs: int) -> None:
    """``harness.train`` with each run's overrides, ``jobs`` launches at a time (each 1 trainer +
    ``nproc`` - 1 evaluators: on a 2-core machine two offline runs side by side keep both cores
    busy); each one's output goes to ``<run dir>.log``."""
    waiting = list(runs)
    running: list[tuple[subprocess.Popen, str]] = []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    while waiting or running:
        while waiting and len(running) < jobs:
            run_dir, overrides = waiting.pop(0)
            cmd = torchrun(nproc, "harness.train", *overrides)
            print("+", " ".join(cmd), flush=True)
            log = (run_dir.parent / f"{run_dir.name}.log").open("w")
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            running.append((proc, log.name))
        done, log_name = running.pop(0)
        if done.wait() != 0:
            raise SystemExit(f"a run failed (exit {done.returncode}): {log_name} says why")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The dataset's options, then the runs' and the table's (:func:`add_run_arguments`)."""
    p.add_argument("--task", choices=sorted(TASKS), default="pendulum")
    p.add_argument(
        "--dataset-seed",
        type=int,
        default=1,
        metavar="N",
        help="seed of the dataset's rollouts (default 1)",
    )
    p.add_argument(
        "--root",
        type=Path,
        default=ROOT,
        metavar="DIR",
        help="where datasets/ and runs/offline/ go (default: the repository)",
    )
    p.add_argument(
        "--expert-run",
        type=Path,
        metavar="RUN_DIR",
        help="a finished run whose final policy is the expert (default: SAC's)",
    )
    p.add_argument(
        "--behaviour-run",
        type=Path,
        metavar="RUN_DIR",
        help="a run whose checkpoints are the behaviour candidates (default: SAC's)",
    )
    add_run_arguments(p)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds", type=int, nargs="+", default=[1], metavar="N", help="(default 1)")
    p.add_argument(
        "--algos",
        nargs="*",
        choices=("iql", "cql"),
        default=["iql", "cql"],
        help="presets to train on the dataset (none: only make the dataset)",
    )
    p.add_argument(
        "--gradient-steps", type=int, metavar="N", help="each run's budget (default: the preset's)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=ROOT / "docs" / "results.md",
        metavar="FILE",
        help="the markdown file whose section for this dataset gets the rows of the presets run",
    )
    p.add_argument(
        "--jobs", type=int, default=1, metavar="N", help="runs launched side by side (default 1)"
    )
    p.add_argument(
        "--nproc", type=int, default=2, metavar="N", help="torchrun's processes per run (default 2)"
    )
    p.add_argument(
        "--label",
        metavar="NAME",
        help="the runs' name beside the preset's, in their directories and table rows (needed with "
        "key=value overrides, which every run then takes)",
    )
    p.add_argument(
        "--scored-at",
        type=int,
        nargs="+",
        default=list(SCORED_AT),
        metavar="STEPS",
        help="gradient steps the table scores at",
    )
    p.add_argument(
        "--summarize",
        action="store_true",
        help="run nothing: the table from the run directories there are",
    )


def given_runs(args: argparse.Namespace) -> tuple[Path | None, Path | None]:
    """``--expert-run`` and ``--behaviour-run``, resolved; a mistake names the flag's need."""
    runs = tuple(r.resolve() if r else None for r in (args.expert_run, args.behaviour_run))
    for given in filter(None, runs):
        if not (given / "checkpoints").is_dir():
            raise UsageError(
                f"{given} has no checkpoints/: --expert-run and --behaviour-run take finished "
                "run directories"
            )
    return runs[0], runs[1]


def run_check(args: argparse.Namespace, overrides: list[str]) -> int:
    """Make (or find) the dataset, train the presets on it unless ``--summarize``, write the
    section."""
    if overrides and not args.label:
        raise UsageError(
            f"{' '.join(overrides)} changes the presets: name the runs with --label NAME"
        )
    root = args.root.resolve()
    data = make_dataset(args.task, args.nproc, root, args.dataset_seed, *given_runs(args))
    if not args.algos:
        return 0
    _, meta = dataset.load(data)
    # a dataset of another seed has runs and a section of its own
    other = "" if args.dataset_seed == 1 else f" --dataset-seed {args.dataset_seed}"
    suffix = (other and f"-data{args.dataset_seed}") + (f"-{args.label}" if args.label else "")
    run_dirs = {
        algo: [
            root / "runs" / "offline" / f"{algo}_{args.task}{suffix}-seed{s}" for s in args.seeds
        ]
        for algo in args.algos
    }
    if not args.summarize:
        (root / "runs" / "offline").mkdir(parents=True, exist_ok=True)  # the runs' logs go there
        train_all(launches(args, run_dirs, data, overrides), args.nproc, args.jobs)
    write_section(args, run_dirs, data, meta, other)
    return 0


def launches(
    args: argparse.Namespace, run_dirs: dict[str, list[Path]], data: Path, overrides: list[str]
) -> list[tuple[Path, list[str]]]:
    """Each run directory and its overrides: its preset on ``data``, its seed, ``overrides``."""
    budget = [f"algo.gradient_steps={args.gradient_steps}"] if args.gradient_steps else []
    return [
        (
            run_dir,
            [
                f"experiment={algo}_{args.task}",
                f"dataset={data}",
                f"seed={seed}",
                f"run_dir={run_dir}",
                "checkpoint.resume=false",
                "logger.console=false",
                *overrides,
                *budget,
            ],
        )
        for algo, dirs in run_dirs.items()
        for seed, run_dir in zip(args.seeds, dirs)
    ]


def write_section(
    args: argparse.Namespace, run_dirs: dict[str, list[Path]], data: Path, meta: Meta, other: str
) -> None:
    """This dataset's section of ``--out``, a row per algorithm."""
    # the presets' evaluation episodes (IQL's and CQL's are the same)
    episodes = OmegaConf.load(run_dirs[args.algos[0]][0] / "config.yaml").eval.episodes
    name = f"{meta.env} medium"
    lines = []
    for algo, dirs in run_dirs.items():
        label = algo.upper() + (f" ({args.label})" if args.label else "")
        lines.append(offline_row(label, name, dirs, meta, tuple(args.scored_at)))
        print(lines[-1], flush=True)
    title = f"Offline: IQL and CQL on {name}{other and f' (dataset seed {args.dataset_seed})'}"
    made_by = (
        f"Made by `harness results offline --task {args.task}{other}` on "
        f"{time.strftime('%Y-%m-%d')} (1 trainer + {args.nproc - 1} evaluating collector(s) "
        "through torchrun, 2-core no-GPU machine)."
    )
    shown = data.relative_to(ROOT) if data.is_relative_to(ROOT) else data
    head = section(title, made_by, str(shown), meta, episodes, args.scored_at)
    replace_section(args.out, head + "\n".join(lines) + "\n")
    print(f"wrote {args.out}")
