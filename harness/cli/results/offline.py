"""``harness results offline``: a dataset by D4RL's recipe, BC, IQL and CQL on it, their section
of docs/results.md.

    harness results offline                                     # pendulum_medium, dataset seed 0
    harness results offline --recipe hopper_medium --algos bc iql --seeds 1 2 3
    harness results offline --recipe hopper_medium_replay --dataset-seed 1
    harness results offline --root /tmp/offline --algos cql --out /tmp/offline/results.md
    harness results offline --recipe hopper_medium --algos cql --seeds 1 2 --jobs 2 \\
        --label lr3e-5 algo.actor_lr=3e-5       # a variant of a preset, two runs side by side
    harness results offline --recipe hopper_medium --algos cql --seeds 1 2 --summarize

The dataset is ``harness dataset recipe=<recipe> seed=<dataset seed>`` (``conf/recipe/``,
docs/offline.md), run in ``--root`` (default: the repository) unless it is there already; its
training run goes where the recipe says (``runs/recipes/``), so ``medium`` and ``medium_replay`` of
one seed share it. Then the ``<algo>_<env>`` presets (``bc_hopper``, ``iql_hopper``, ...) learn from
it through torchrun (1 trainer + ``--nproc`` - 1 evaluating collectors), with the ``key=value``
overrides given (name such runs with ``--label``), in ``runs/offline/`` under ``--root``. Each row
gives CORL's published score on the D4RL dataset of the recipe's name beside the run's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from harness.cli.results.offline_table import SCORED_AT, offline_row, replace_section, section
from harness.cli.usage import UsageError
from harness.data import dataset
from harness.data.format import Meta

ROOT = Path(__file__).resolve().parents[3]  # the checkout: datasets/, runs/, docs/results.md
RECIPES = ROOT / "conf" / "recipe"
BIN = Path(sys.executable).parent
SUMMARY = "a dataset by D4RL's recipe, BC, IQL and CQL on it; their section of docs/results.md"

# CORL's last scores (normalised, mean ± std over seeds) on the D4RL datasets of these names, 1M
# gradient steps: the "Last Scores" table of tinkoff-ai/CORL's README at commit 022e449.
CORL = {
    "halfcheetah-medium": {"bc": "42.40 ± 0.19", "cql": "47.04 ± 0.22", "iql": "48.31 ± 0.22"},
    "halfcheetah-medium-replay": {
        "bc": "35.66 ± 2.33",
        "cql": "45.04 ± 0.27",
        "iql": "44.46 ± 0.22",
    },
    "hopper-medium": {"bc": "53.51 ± 1.76", "cql": "59.08 ± 3.77", "iql": "67.53 ± 3.78"},
    "hopper-medium-replay": {"bc": "29.81 ± 2.07", "cql": "95.11 ± 5.27", "iql": "97.43 ± 6.39"},
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


def recipe_spec(name: str, seed: int) -> DictConfig:
    """``conf/recipe/<name>.yaml`` with ``seed`` set (its ``out`` names the seed)."""
    path = RECIPES / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in RECIPES.glob("*.yaml")))
        raise UsageError(f"--recipe {name}: no conf/recipe/{name}.yaml (there are: {known})")
    spec = OmegaConf.load(path)
    assert isinstance(spec, DictConfig)
    spec.seed = seed
    return spec


def env_group(spec: DictConfig) -> str:
    """The recipe's env (its ``override /env`` default): the presets' suffix."""
    for entry in spec.get("defaults", []):
        if isinstance(entry, DictConfig) and "override /env" in entry:
            return str(entry["override /env"])
    raise UsageError("the recipe names no env (defaults: - override /env: <env>)")


def make_dataset(name: str, seed: int, root: Path) -> Path:
    """``harness dataset recipe=<name> seed=<seed>`` in ``root``, unless its dataset is there."""
    out = root / str(recipe_spec(name, seed).out)
    if not (out / "meta.json").exists():
        cmd = [str(BIN / "harness"), "dataset", f"recipe={name}", f"seed={seed}"]
        print("+", " ".join(cmd), flush=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run(cmd, cwd=root, env=env, check=True)
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
    p.add_argument(
        "--recipe",
        default="pendulum_medium",
        metavar="NAME",
        help="the dataset's recipe, conf/recipe/NAME.yaml (default pendulum_medium)",
    )
    p.add_argument(
        "--dataset-seed",
        type=int,
        default=0,
        metavar="N",
        help="the recipe's seed (default 0)",
    )
    p.add_argument(
        "--root",
        type=Path,
        default=ROOT,
        metavar="DIR",
        help="where datasets/, runs/recipes/ and runs/offline/ go (default: the repository)",
    )
    add_run_arguments(p)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds", type=int, nargs="+", default=[1], metavar="N", help="(default 1)")
    p.add_argument(
        "--algos",
        nargs="*",
        choices=("bc", "iql", "cql"),
        default=["bc", "iql", "cql"],
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


def run_check(args: argparse.Namespace, overrides: list[str]) -> int:
    """Make (or find) the dataset, train the presets on it unless ``--summarize``, write the
    section."""
    if overrides and not args.label:
        raise UsageError(
            f"{' '.join(overrides)} changes the presets: name the runs with --label NAME"
        )
    root = args.root.resolve()
    spec = recipe_spec(args.recipe, args.dataset_seed)
    env = env_group(spec)
    for algo in args.algos:
        if not (ROOT / "conf" / "experiment" / f"{algo}_{env}.yaml").exists():
            raise UsageError(f"--algos {algo}: there is no preset {algo}_{env} for this recipe")
    suffix = f"-data{args.dataset_seed}" + (f"-{args.label}" if args.label else "")
    run_dirs = {
        algo: [
            root / "runs" / "offline" / f"{algo}_{args.recipe}{suffix}-seed{s}" for s in args.seeds
        ]
        for algo in args.algos
    }
    if not args.summarize:
        refuse_earlier_runs([d for dirs in run_dirs.values() for d in dirs])
    data = make_dataset(args.recipe, args.dataset_seed, root)
    if not args.algos:
        return 0
    _, meta = dataset.load(data)
    if not args.summarize:
        (root / "runs" / "offline").mkdir(parents=True, exist_ok=True)  # the runs' logs go there
        train_all(launches(args, env, run_dirs, data, overrides), args.nproc, args.jobs)
    write_section(args, run_dirs, data, meta)
    return 0


def refuse_earlier_runs(run_dirs: list[Path]) -> None:
    """Refuse, before anything runs, a launch into run directories that hold earlier runs: the
    run itself would refuse them, but only after its log (``<run dir>.log``) was written over."""
    earlier = [
        path
        for run_dir in run_dirs
        for path in (run_dir, run_dir.parent / f"{run_dir.name}.log")
        if path.exists()
    ]
    if earlier:
        raise UsageError(
            f"{earlier[0]} is an earlier run's ({len(earlier)} such paths): name these runs with "
            "--label NAME, table the earlier ones with --summarize, or move them away"
        )


def launches(
    args: argparse.Namespace,
    env: str,
    run_dirs: dict[str, list[Path]],
    data: Path,
    overrides: list[str],
) -> list[tuple[Path, list[str]]]:
    """Each run directory and its overrides: its preset on ``data``, its seed, ``overrides``."""
    budget = [f"algo.gradient_steps={args.gradient_steps}"] if args.gradient_steps else []
    return [
        (
            run_dir,
            [
                f"experiment={algo}_{env}",
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
    args: argparse.Namespace, run_dirs: dict[str, list[Path]], data: Path, meta: Meta
) -> None:
    """This dataset's section of ``--out``, a row per algorithm."""
    # the presets' evaluation episodes (the offline presets of a task evaluate alike)
    episodes = OmegaConf.load(run_dirs[args.algos[0]][0] / "config.yaml").eval.episodes
    name = f"{args.recipe} seed {args.dataset_seed}"
    d4rl = args.recipe.replace("_", "-")
    lines = []
    for algo, dirs in run_dirs.items():
        label = algo.upper() + (f" ({args.label})" if args.label else "")
        corl = CORL.get(d4rl, {}).get(algo, "-")
        lines.append(offline_row(label, name, dirs, meta, tuple(args.scored_at), corl))
        print(lines[-1], flush=True)
    command = f"harness results offline --recipe {args.recipe} --dataset-seed {args.dataset_seed}"
    made_by = (
        f"Made by `{command}` with each row's `--algos`, `--seeds` and `--gradient-steps` (a "
        "labelled row: `--label NAME` and its overrides, docs/offline.md) on "
        f"{time.strftime('%Y-%m-%d')} (1 trainer + {args.nproc - 1} "
        "evaluating collector(s) through torchrun, 2-core no-GPU machine). CORL: its last score "
        f"on D4RL's {d4rl}-v2 (tinkoff-ai/CORL's README at commit 022e449), another dataset of "
        "the same recipe."
    )
    shown = data.relative_to(ROOT) if data.is_relative_to(ROOT) else data
    title = f"Offline on {name}"
    head = section(title, made_by, str(shown), meta, episodes, args.scored_at)
    replace_section(args.out, head + "\n".join(lines) + "\n")
    print(f"wrote {args.out}")
