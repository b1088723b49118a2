"""Run every SOTA preset and write docs/results.md.

    scripts/sota_check.sh                 # every preset at its full budget
    scripts/sota_check.sh --frames 20000  # each capped (a smoke run; the table says so)
    scripts/sota_check.sh --only sac_pendulum td3_pendulum

Each preset runs through torchrun with 1 trainer and NPROC-1 collectors
(default NPROC=2) in runs/sota/<preset>. The final return is the mean of
``eval/return`` over the last two evaluations where the preset evaluates,
else the mean ``train/episode_return`` of the last three log rows.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# preset: (algorithm, task, published score and source); the sources are public benchmark tables
PRESETS = {
    "ppo_cartpole": ("PPO", "CartPole-v1", "490 ± 6 at 500k (CleanRL)"),
    "dqn_cartpole": ("DQN", "CartPole-v1", "489 ± 16 at 500k (CleanRL)"),
    "sac_pendulum": ("SAC", "Pendulum-v1", "about -150 at 20k"),
    "td3_pendulum": ("TD3", "Pendulum-v1", "about -150 at 20k"),
    "ppo_halfcheetah": ("PPO", "HalfCheetah-v5", "1443 ± 46 on v4 at 1M (CleanRL)"),
    "sac_halfcheetah": ("SAC", "HalfCheetah-v5", "9635 ± 1424 on v4 at 1M (CleanRL)"),
    "td3_halfcheetah": ("TD3", "HalfCheetah-v5", "9583 ± 126 on v4 at 1M (CleanRL)"),
    "sac_hopper": ("SAC", "Hopper-v5", "2310 ± 343 on v4 at 1M (CleanRL)"),
    "td3_hopper": ("TD3", "Hopper-v5", "3135 ± 360 on v4 at 1M (CleanRL)"),
}


def final_return(rows: list[dict]) -> tuple[float, str]:
    evals = [float(r["eval/return"]) for r in rows if r.get("eval/return")]
    if evals:
        return statistics.mean(evals[-2:]), "eval"
    train = [float(r["train/episode_return"]) for r in rows if r.get("train/episode_return") not in (None, "", "nan")]
    return (statistics.mean(train[-3:]) if train else math.nan), "train"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, help="cap every preset at this many frames")
    parser.add_argument("--only", nargs="+", choices=sorted(PRESETS), help="run these presets only")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results.md")
    args = parser.parse_args()
    nproc = int(os.environ.get("NPROC", 2))
    lines = []
    for preset in args.only or PRESETS:
        algo, task, published = PRESETS[preset]
        run_dir = ROOT / "runs" / "sota" / preset
        cmd = [str(Path(sys.executable).parent / "torchrun"), "--standalone", f"--nproc_per_node={nproc}", "-m", "harness.train",
               f"experiment={preset}", f"run_dir={run_dir}", "checkpoint.resume=false", "logger.console=false"]
        if args.frames:
            cmd.append(f"collector.total_frames={args.frames}")
        print("+", " ".join(cmd), flush=True)
        start = time.monotonic()
        done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        wall = time.monotonic() - start
        if done.returncode:
            lines.append(f"| {algo} | {task} | - | failed (exit {done.returncode}) | {published} | {wall:.0f} s | - |")
            continue
        rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
        frames = int(rows[-1]["frames"])
        value, source = final_return(rows)
        lines.append(f"| {algo} | {task} | {frames:,} | {value:.1f} ({source}) | {published} | {wall:.0f} s | {frames / wall:,.0f} |")
        print(lines[-1], flush=True)
    write_table(args.out, lines, nproc, args.frames)


HEADER = "| algorithm | task | frames | final return | published | wall time | frames/s |"


def write_table(out: Path, lines: list[str], nproc: int, cap: int | None) -> None:
    """Replace the rows of the presets just run (keyed by algorithm and task),
    keep the others, so partial runs build the table up. Sections from the
    first ``## `` heading on (notes, the offline results) are kept as they are."""
    def key(line: str) -> tuple[str, str]:
        return tuple(cell.strip() for cell in line.strip("|").split("|")[:2])

    text = out.read_text() if out.exists() else ""
    cut = text.find("\n## ")
    head, sections = (text, "") if cut < 0 else (text[:cut], text[cut:])
    rows = {key(line): line for line in head.splitlines() if line.startswith("| ") and not line.startswith(HEADER[:12]) and "---" not in line}
    rows.update({key(line): line for line in lines})
    note = f"Capped at {cap:,} frames: a smoke run, not the published budget." if cap else "Full budgets."
    out.write_text(
        "# Results\n\n"
        "Made by `scripts/sota_check.sh` (1 trainer + NPROC-1 collectors through torchrun, on this project's 2-core,\n"
        f"no-GPU machine). Last update {time.strftime('%Y-%m-%d')}, NPROC={nproc}; {note}\n"
        "Final return: mean `eval/return` of the last two evaluations (deterministic policy) where the preset\n"
        "evaluates, else mean `train/episode_return` of the last three log rows. Offline presets: below.\n\n"
        f"{HEADER}\n| --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows.values()) + "\n" + sections
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
