"""Sync rounds against async streaming when one collector is slow.

The default job's PPO (CartPole settings) with 1 trainer + ``--collectors``
collectors on ``slow_env:SlowCartPole-v0`` (benchmarks/slow_env.py: every
env step sleeps ``--step-s``), in four cases, each a real torchrun launch:
sync and async mode, with every collector alike ("even") and with the last
one's steps ``--factor`` times as long ("slowed"). Per case the median over
``--repeats`` launches (run interleaved, so a noisy machine hits all alike) of
the frames learned per second (the rows' ``collect/frames_per_s``, the first
row left out: start-up), the share of frames dropped for lag, and the
trainer's and collectors' idle shares.

What to expect: in sync mode a round waits for its slowest collector, so the
job falls to that collector's pace; async streaming loses at most what the
slow collector no longer delivers, its share of the even job's frames (less,
as long as its batches stay within ``collector.max_policy_lag``).

    python benchmarks/slow_collector.py --json /tmp/slow_collector.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from jobs import run_job

COLUMNS = (
    "collect/frames_per_s",
    "collect/frames_dropped_fraction",
    "train/idle_fraction",
    "collect/idle_fraction",
)


def launch(mode: str, slowed: bool, args: argparse.Namespace, seed: int) -> dict[str, float]:
    """One run; the medians of its rows' COLUMNS, the first row left out."""
    nproc = 1 + args.collectors
    slow = {
        "SLOW_STEP_S": str(args.step_s),
        "SLOW_FACTOR": str(args.factor),
        "SLOW_RANK": str(nproc - 1) if slowed else "none",
    }
    overrides = [
        "env.id=slow_env:SlowCartPole-v0",
        f"collector.mode={mode}",
        f"collector.total_frames={args.frames}",
        f"logger.log_every_frames={args.frames // 10}",
        f"seed={seed}",
    ]
    rows = run_job(nproc, overrides, slow, timeout=1800)
    return {k: statistics.median(float(r[k]) for r in rows) for k in COLUMNS}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--collectors", type=int, default=4)
    parser.add_argument("--step-s", type=float, default=0.0025, help="seconds an env step sleeps")
    parser.add_argument(
        "--factor",
        type=float,
        default=3.0,
        help="how many times longer the slowed collector's steps take",
    )
    parser.add_argument("--frames", type=int, default=40_000, help="frames per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    cases = [(mode, slowed) for mode in ("sync", "async") for slowed in (False, True)]
    results: dict[tuple[str, bool], list[dict[str, float]]] = {case: [] for case in cases}
    for repeat in range(args.repeats):
        for mode, slowed in cases:
            results[mode, slowed].append(launch(mode, slowed, args, seed=1 + repeat))
            print(
                f"repeat {repeat + 1} {mode} {'slowed' if slowed else 'even'}: "
                f"{results[mode, slowed][-1]}",
                flush=True,
            )
    rows: list[dict[str, Any]] = []
    for mode, slowed in cases:
        row: dict[str, Any] = {"mode": mode, "collectors": "slowed" if slowed else "even"}
        row.update({k: statistics.median(r[k] for r in results[mode, slowed]) for k in COLUMNS})
        rows.append(row)
    for row in rows:
        even = next(r for r in rows if r["mode"] == row["mode"] and r["collectors"] == "even")
        row["frames_per_s_vs_even"] = row["collect/frames_per_s"] / even["collect/frames_per_s"]
        print(
            "  ".join(
                f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
            )
        )
    print(f"the slowed collector's share of the even job's frames: {1 / args.collectors:.3g}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
