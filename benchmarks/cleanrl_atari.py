"""``ppo_atari`` side by side with CleanRL's ``ppo_atari_envpool.py``, run unmodified: same game,
same frames (agent steps, as CleanRL counts them), seeds interleaved (harness, CleanRL, harness,
...) so that a noisy machine hits both alike. The two sides play by different env rules: the
harness's ale-py env by SB3's wrappers' (as CleanRL's ``ppo_atari.py``), CleanRL's by envpool's
(docs/pixels.md), so it compares two envs as well as two trainers, unless the harness plays envpool
too: ``--harness-overrides env.backend=envpool`` (the harness on envpool 1.2.5, CleanRL's script on
the 0.8.4 of its own environment; both envpool's Atari rules, made with the script's arguments).

CleanRL's script lives outside this repository, in its own environment (it needs envpool and the old
``gym``):

    python3.11 -m venv /tmp/cleanrl/.venv
    /tmp/cleanrl/.venv/bin/pip install torch envpool==0.8.4 gym==0.23.1 tyro tensorboard 'numpy<2'
    REV=fe8d8a03c41a7ef5b523e2e354bd01c363e786bb  # the CleanRL commit compared against
    curl -L -o /tmp/cleanrl/ppo_atari_envpool.py \\
        https://raw.githubusercontent.com/vwxyzjn/cleanrl/$REV/cleanrl/ppo_atari_envpool.py
    python benchmarks/cleanrl_atari.py --python /tmp/cleanrl/.venv/bin/python \\
        --script /tmp/cleanrl/ppo_atari_envpool.py --frames 286720 \\
        --keep /tmp/cleanrl_atari --json /tmp/cleanrl_atari.json

(envpool 0.8.4: CleanRL pins envpool below 0.7, which has no wheel for Python 3.11, and 1.x's
``gym`` flavour no longer runs the script unmodified.)

Each side is launched as its users launch it: CleanRL as ``python ppo_atari_envpool.py --seed S
--total-timesteps N`` (torch's default threads: every core), the harness as ``torchrun
--nproc_per_node=3 -m harness.train experiment=ppo_atari seed=S collector.total_frames=N`` with
``OMP_NUM_THREADS=1`` (what ``scripts/train.sh`` sets) and ``--harness-overrides``. Both anneal the
learning rate to 0 at N frames.

Reported per side (medians over seeds, and each seed): frames/s over the whole launch (N / wall
time, start-up included) and in steady state (the harness's median ``collect/frames_per_s``,
CleanRL's last printed SPS); the mean training-episode return (raw game score, lives summed) of the
episodes that ended in the last ``--window`` frames before N/2 and before N.

``--async-batch-size B`` (with ``--harness-overrides env.backend=envpool``) adds a third side,
``harness_async``: after each seed's pair, the harness again in envpool's asynchronous mode
(``env.envpool.batch_size=B``: each collector acts on whichever B of its envs are ready).

Where one sitting cannot hold every seed (1M frames a run is 60 to 85 minutes a seed here, both
sides), run one seed per sitting, each side by side, and report them together: ``--merge a.json
b.json c.json [--json all.json]``."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from jobs import run_job

EPISODE = re.compile(r"global_step=(\d+), episodic_return=\[?([-\d.e+]+)")
SPS = re.compile(r"SPS: (\d+)")


def window_mean(episodes: list[tuple[int, float]], end: int, window: int) -> float:
    """The mean return of the episodes that ended in the ``window`` frames up to ``end``."""
    returns = [r for frames, r in episodes if end - window < frames <= end]
    return statistics.mean(returns) if returns else float("nan")


def run_harness(
    seed: int, frames: int, window: int, overrides: list[str], keep: Path | None, side: str
) -> dict[str, Any]:
    start = time.perf_counter()
    # its rows after the first, which holds start-up; the half and the end are among them
    rows = run_job(
        3,
        [
            "experiment=ppo_atari",
            f"seed={seed}",
            f"collector.total_frames={frames}",
            f"logger.log_every_frames={window}",
            *overrides,
        ],
        timeout=None,
        keep=keep and keep / side / f"seed-{seed}",
    )
    wall = time.perf_counter() - start
    # A row's train/episode_return is already the mean over the episodes that ended in its window.
    returns = {int(float(r["frames"])): float(r["train/episode_return"] or "nan") for r in rows}
    steady = statistics.median(float(r["collect/frames_per_s"]) for r in rows)
    return {
        "wall_s": wall,
        "frames_per_s": frames / wall,
        "steady_frames_per_s": steady,
        "return_half": returns.get(frames // 2, float("nan")),
        "return_end": returns.get(frames, float("nan")),
    }


def run_cleanrl(
    python: str, script: str, seed: int, frames: int, window: int, keep: Path | None
) -> dict[str, Any]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONPATH")
    }
    # it writes runs/ (tensorboard) into its working directory
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [python, script, "--seed", str(seed), "--total-timesteps", str(frames)]
        start = time.perf_counter()
        out = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    episodes = [(int(s), float(r)) for s, r in EPISODE.findall(out.stdout)]
    if keep:  # its printed episodes and SPS, as it printed them
        (keep / "cleanrl" / f"seed-{seed}").mkdir(parents=True, exist_ok=True)
        lines = [line for line in out.stdout.splitlines() if EPISODE.match(line) or SPS.match(line)]
        (keep / "cleanrl" / f"seed-{seed}" / "stdout.txt").write_text("\n".join(lines) + "\n")
    return {
        "wall_s": wall,
        "frames_per_s": frames / wall,
        "steady_frames_per_s": float(SPS.findall(out.stdout)[-1]),
        "return_half": window_mean(episodes, frames // 2, window),
        "return_end": window_mean(episodes, frames, window),
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("wall_s", "frames_per_s", "steady_frames_per_s", "return_half", "return_end")
    ends = [r["return_end"] for r in runs]
    return {k: statistics.median(r[k] for r in runs) for k in keys} | {
        "return_end_mean": statistics.mean(ends),
        "return_end_sd": statistics.stdev(ends)
        if len(ends) > 1
        else 0.0,  # the seeds' spread (n - 1)
    }


def report(
    runs: dict[str, list[dict[str, Any]]], frames: int, window: int, overrides: list[str]
) -> dict[str, Any]:
    """Every run and each side's summary, printed with the ratio of frames/s."""
    summaries = {side: summary(side_runs) for side, side_runs in runs.items()}
    for side, s in summaries.items():
        print(side, {k: round(v, 2) for k, v in s.items()})
    h, c = summaries["harness"], summaries["cleanrl"]
    print(
        f"frames/s, harness vs CleanRL: {h['frames_per_s'] / c['frames_per_s']:.2f}x (whole "
        f"launch), {h['steady_frames_per_s'] / c['steady_frames_per_s']:.2f}x (steady)"
    )
    print(
        f"return at {frames:,} frames, mean ± sd over {len(runs['harness'])} and "
        f"{len(runs['cleanrl'])} seeds: harness {h['return_end_mean']:.1f} ± "
        f"{h['return_end_sd']:.1f}, CleanRL {c['return_end_mean']:.1f} ± {c['return_end_sd']:.1f}"
    )
    if "harness_async" in summaries:
        a = summaries["harness_async"]
        print(
            f"frames/s, harness in envpool's asynchronous mode vs CleanRL: "
            f"{a['frames_per_s'] / c['frames_per_s']:.2f}x (whole launch), "
            f"{a['steady_frames_per_s'] / c['steady_frames_per_s']:.2f}x (steady); its return at "
            f"{frames:,} frames {a['return_end_mean']:.1f} ± {a['return_end_sd']:.1f}"
        )
    return {
        "frames": frames,
        "window": window,
        "overrides": overrides,
        "runs": runs,
        "summary": summaries,
    }


def merged(paths: list[str]) -> dict[str, Any]:
    """One report of the runs in several ``--json`` files (seeds run in separate sittings, each side
    by side)."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    settings = {(r["frames"], r["window"], tuple(r["overrides"])) for r in parts}
    if len(settings) != 1:
        raise SystemExit(
            f"--merge: the files ran different frames, windows or overrides: {sorted(settings)}"
        )
    sides = set.intersection(*(set(r["runs"]) for r in parts))
    runs = {side: [run for r in parts for run in r["runs"][side]] for side in sorted(sides)}
    return report(runs, parts[0]["frames"], parts[0]["window"], parts[0]["overrides"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", help="the Python of CleanRL's environment")
    parser.add_argument("--script", help="CleanRL's ppo_atari_envpool.py")
    parser.add_argument(
        "--frames", type=int, default=307_200, help="agent steps per run (a multiple of 1024)"
    )
    parser.add_argument(
        "--window", type=int, default=20_480, help="frames whose episodes make a return"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument(
        "--harness-overrides", nargs="*", default=[], help="Hydra overrides of the harness's job"
    )
    parser.add_argument(
        "--async-batch-size",
        type=int,
        default=0,
        help="also run the harness in envpool's asynchronous mode after each seed's pair, with "
        "these overrides and env.envpool.batch_size=B (a third side, harness_async)",
    )
    parser.add_argument("--json", help="write every run and the summary here")
    parser.add_argument("--keep", type=Path, help="keep each run's metrics here (<side>/seed-N)")
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="run nothing: report the runs of these --json files",
    )
    args = parser.parse_args()
    if args.merge:
        result = merged(args.merge)
    else:
        if not (args.python and args.script):
            parser.error("--python and --script are required unless --merge")
        if args.frames % 1024 or args.frames % (2 * args.window):
            parser.error(
                "--frames must be a multiple of 1024 (a round of both) and of 2 x --window"
            )
        runs: dict[str, list[dict[str, Any]]] = {"harness": [], "cleanrl": []}
        if args.async_batch_size:
            runs["harness_async"] = []
        for seed in args.seeds:
            harness = run_harness(
                seed, args.frames, args.window, args.harness_overrides, args.keep, "harness"
            )
            runs["harness"].append({"seed": seed, **harness})
            print("harness", runs["harness"][-1], flush=True)
            cleanrl = run_cleanrl(
                args.python, args.script, seed, args.frames, args.window, args.keep
            )
            runs["cleanrl"].append({"seed": seed, **cleanrl})
            print("cleanrl", runs["cleanrl"][-1], flush=True)
            if args.async_batch_size:
                overrides = [
                    *args.harness_overrides,
                    f"env.envpool.batch_size={args.async_batch_size}",
                ]
                harness = run_harness(
                    seed, args.frames, args.window, overrides, args.keep, "harness_async"
                )
                runs["harness_async"].append({"seed": seed, **harness})
                print("harness_async", runs["harness_async"][-1], flush=True)
        result = report(runs, args.frames, args.window, args.harness_overrides)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
