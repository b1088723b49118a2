"""Make a "medium" dataset with the harness, run IQL and CQL on it, write their section of docs/results.md.

    scripts/offline_check.sh                    # Pendulum (about 15 minutes on 2 cores)
    scripts/offline_check.sh --task hopper      # Hopper (SAC to 1M frames first: a bigger machine)
    scripts/offline_check.sh --seeds 1 2 3

As D4RL's "medium": SAC is trained to expert level (its final policy is the
expert reference); a second SAC run keeps a checkpoint every few hundred
frames, and the first one whose stochastic policy scores inside the task's
band writes the dataset. Then the ``iql_<task>`` and ``cql_<task>`` presets
learn from it through torchrun (1 trainer + NPROC-1 evaluating collectors).
Everything lands in runs/offline/ and datasets/; existing datasets are reused.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness.data import dataset

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TASKS = {
    # expert preset, frames of the checkpointed run, checkpoint spacing, behaviour-return band, dataset size
    "pendulum": {"env": "pendulum", "expert": "sac_pendulum", "frames": 4500, "every": 256, "band": (-700, -400), "size": 50_000},
    "hopper": {"env": "hopper", "expert": "sac_hopper", "frames": 400_000, "every": 10_000, "band": (1000, 1800), "size": 1_000_000},
}


def run(args: list[str], **kw) -> None:
    print("+", " ".join(args), flush=True)
    subprocess.run(args, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True, **kw)


def torchrun(nproc: int, module: str, *overrides: str) -> None:
    run([str(BIN / "torchrun"), "--standalone", f"--nproc_per_node={nproc}", "-m", module, *overrides])


def make_dataset(task: str, nproc: int) -> Path:
    spec, out = TASKS[task], ROOT / "datasets" / f"{task}-medium"
    if (out / "meta.json").exists():
        return out
    runs = ROOT / "runs" / "offline"
    expert, medium = runs / f"{task}-sac-expert", runs / f"{task}-sac-medium"
    if not (expert / "checkpoints").exists():
        torchrun(nproc, "harness.train", f"experiment={spec['expert']}", f"run_dir={expert}", "logger.console=false")
    if not (medium / "checkpoints").exists():
        torchrun(nproc, "harness.train", f"experiment={spec['expert']}", f"run_dir={medium}", "logger.console=false",
                 f"collector.total_frames={spec['frames']}", f"checkpoint.every_frames={spec['every']}", "checkpoint.keep=1000")
    low, high = spec["band"]
    probe = runs / f"{task}-probe"
    for checkpoint in sorted((medium / "checkpoints").glob("step-*")):
        shutil.rmtree(probe, ignore_errors=True)
        torchrun(nproc, "harness.write_dataset", f"env={spec['env']}", f"policy={checkpoint}", f"out={probe}",
                 f"frames={spec['size'] // 5}", "reference.random_return=0")
        behaviour = dataset.load(probe)[1].behaviour_return
        print(f"{checkpoint.name}: behaviour return {behaviour:.1f}", flush=True)
        if low <= behaviour <= high:
            torchrun(nproc, "harness.write_dataset", f"env={spec['env']}", f"policy={checkpoint}", f"out={out}",
                     f"frames={spec['size']}", f"reference.expert_policy={expert}", "reference.episodes=20")
            return out
    raise SystemExit(f"no checkpoint of {medium} scores inside {spec['band']}: change the band or the run")


def replace_section(out: Path, section: str) -> None:
    """Put ``section`` (it starts with its ``## `` heading) into ``out``, in
    place of the section of the same heading; the rest of the file stays."""
    text = out.read_text() if out.exists() else "# Results\n"
    heading = section.strip().splitlines()[0]
    start = text.find("\n" + heading)
    if start < 0:
        text = text.rstrip("\n") + "\n" + section
    else:
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + (text[end:] if end >= 0 else "")
    out.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(TASKS), default="pendulum")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results.md")
    args = parser.parse_args()
    nproc = int(os.environ.get("NPROC", 2))
    data = make_dataset(args.task, nproc)
    _, meta = dataset.load(data)
    lines = []
    for algo in ("iql", "cql"):
        finals, walls = [], []
        for seed in args.seeds:
            run_dir = ROOT / "runs" / "offline" / f"{algo}_{args.task}-seed{seed}"
            start = time.monotonic()
            torchrun(nproc, "harness.train", f"experiment={algo}_{args.task}", f"dataset={data}", f"seed={seed}",
                     f"run_dir={run_dir}", "checkpoint.resume=false", "logger.console=false")
            walls.append(time.monotonic() - start)
            rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
            finals.append(statistics.mean(float(r["eval/return"]) for r in rows[-3:]))  # last three evaluations
        steps = int(rows[-1]["gradient_steps"])
        mean = statistics.mean(finals)
        spread = f" ± {statistics.stdev(finals):.1f}" if len(finals) > 1 else ""
        norm = meta.normalized(mean)
        verdict = "above" if mean > meta.behaviour_return else "NOT above"
        lines.append(f"| {algo.upper()} | {meta.env} medium | {steps:,} | {len(finals)} | {mean:.1f}{spread} | {norm:.1f} | "
                     f"{meta.behaviour_return:.1f} ({verdict}) | {statistics.mean(walls):.0f} s |")
        print(lines[-1], flush=True)
    section = (
        f"\n## Offline: IQL and CQL on {meta.env} medium\n\n"
        f"Made by `scripts/offline_check.sh --task {args.task}` on {time.strftime('%Y-%m-%d')} (1 trainer + {nproc - 1} evaluating "
        "collector(s) through torchrun, 2-core no-GPU machine).\n"
        f"Dataset `{data.relative_to(ROOT)}`: {meta.transitions:,} transitions of a SAC policy stopped early; "
        f"behaviour return {meta.behaviour_return:.1f}, random {meta.random_return:.1f}, expert {meta.expert_return:.1f} "
        "(the fully trained SAC policy, deterministic).\n"
        "Final return: per seed, the mean `eval/return` of the last three evaluations (10 deterministic episodes each); "
        "normalised: `100 * (R - random) / (expert - random)`.\n\n"
        "| algorithm | dataset | gradient steps | seeds | final return | normalised | behaviour return | wall time |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(lines) + "\n"
    )
    replace_section(args.out, section)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
