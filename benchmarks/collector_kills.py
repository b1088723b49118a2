"""A collector SIGKILLed every 20 s: does the job go on, learn as it would, and keep its pace?

Each case is a real torchrun launch with 4 collectors and
``collector.max_restarts`` set (docs/runs_that_last.md), once untouched ("steady") and
once with one collector's worker process SIGKILLed every ``--every`` seconds,
round robin over the collectors, from the first kill at ``--every`` seconds
to the run's end ("killed"). The default job (PPO on CartPole, 500k frames,
sync rounds) also runs without supervision ("plain"), for what supervision
itself costs. Seeds are interleaved, so a noisy machine hits every variant alike.

Per launch: frames per second of training (the last row's frames over its
``time_s``), whether it reached the job's threshold (the default job: a
``train/episode_return`` row >= 475; ``sac_pendulum``: its last
``eval/return`` >= -200), the kills, the replacements, and for each kill the
seconds from the kill to the replacement's first batch reaching the rank (its
log line's arrival here), whose median is the issue's "acts within 10 s".

    python benchmarks/collector_kills.py --json /tmp/collector_kills.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from jobs import job_command, job_env

FIRST_BATCH = re.compile(r"collector rank (\d+): the replacement's first batch came")
JOBS: dict[str, dict[str, Any]] = {
    "default": {"overrides": [], "variants": ("plain", "steady", "killed")},
    "sac_pendulum": {"overrides": ["experiment=sac_pendulum"], "variants": ("steady", "killed")},
}


def ancestors(pid: int) -> list[int]:
    chain = []
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        chain.append(pid)
    return chain


def worker_of(rank: int, launcher: int) -> int | None:
    """The pid of collector ``rank``'s worker under the torchrun ``launcher``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if comm == f"collector{rank}" and launcher in ancestors(int(entry.name)):
                return int(entry.name)
    return None


def threshold_met(job: str, rows: list[dict[str, str]]) -> bool:
    if job == "default":
        return any(
            r["train/episode_return"] and float(r["train/episode_return"]) >= 475 for r in rows
        )
    evals = [float(r["eval/return"]) for r in rows if r.get("eval/return")]
    return bool(evals) and evals[-1] >= -200


def launch(job: str, variant: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    collectors = 4
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [*JOBS[job]["overrides"], f"seed={seed}"]
        if variant != "plain":
            overrides.append(f"collector.max_restarts={args.max_restarts}")
        cmd = job_command(1 + collectors, overrides, f"{tmp}/run")
        env = job_env()
        proc = subprocess.Popen(
            cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        lines: list[tuple[float, str]] = []
        output = proc.stdout
        assert output is not None  # stdout=PIPE
        reader = threading.Thread(
            target=lambda: lines.extend((time.monotonic(), line) for line in output), daemon=True
        )
        reader.start()
        kills: list[tuple[float, int]] = []
        start, rank = time.monotonic(), 1
        while proc.poll() is None:
            time.sleep(0.2)
            if variant == "killed" and time.monotonic() - start >= args.every * (len(kills) + 1):
                pid = worker_of(rank, proc.pid)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    kills.append((time.monotonic(), rank))
                rank = rank % collectors + 1
        reader.join(10)
        if proc.returncode:
            raise RuntimeError(
                f"{' '.join(cmd)} failed:\n{''.join(line for _, line in lines[-400:])}"
            )
        with open(f"{tmp}/run/metrics.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    last = rows[-1]
    return {
        "job": job,
        "variant": variant,
        "seed": seed,
        "frames": int(last["frames"]),
        "frames_per_s": int(last["frames"]) / float(last["time_s"]),
        "threshold_met": threshold_met(job, rows),
        "last_return": last.get("eval/return") or last["train/episode_return"],
        "kills": len(kills),
        "restarts": sum(
            float(r["collect/collector_restarts"] or 0)
            for r in rows
            if "collect/collector_restarts" in r
        ),
        "frames_lost": sum(
            float(r["collect/frames_lost"] or 0) for r in rows if "collect/frames_lost" in r
        ),
        "replaced_s": replacement_latencies(lines, kills),
    }


def replacement_latencies(
    lines: list[tuple[float, str]], kills: list[tuple[float, int]]
) -> list[float]:
    """Seconds from each kill to the first batch its collector's new worker sent."""
    latencies = []
    for at, line in lines:
        if found := FIRST_BATCH.search(line):
            before = [t for t, r in kills if r == int(found[1]) and t <= at]
            if before:
                latencies.append(at - before[-1])
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--every", type=float, default=20.0, help="seconds between kills")
    parser.add_argument(
        "--max-restarts", type=int, default=20, help="collector.max_restarts (per collector)"
    )
    parser.add_argument("--json", help="write every launch's result here")
    args = parser.parse_args()
    results = []
    for job in args.jobs:
        for seed in args.seeds:
            for variant in JOBS[job]["variants"]:
                result = launch(job, variant, seed, args)
                results.append(result)
                print(json.dumps(result), flush=True)
    print(
        "\n| job | variant | frames/s (median over seeds) | threshold met | kills | restarts | "
        "replaced in (median s) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for job in args.jobs:
        for variant in JOBS[job]["variants"]:
            mine = [r for r in results if r["job"] == job and r["variant"] == variant]
            waits = [s for r in mine for s in r["replaced_s"]]
            print(
                f"| {job} | {variant} | {statistics.median(r['frames_per_s'] for r in mine):.0f} | "
                f"{sum(r['threshold_met'] for r in mine)}/{len(mine)} | "
                f"{sum(r['kills'] for r in mine)} | {sum(r['restarts'] for r in mine):.0f} | "
                f"{statistics.median(waits) if waits else float('nan'):.2f} |"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
