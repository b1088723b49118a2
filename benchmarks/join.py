"""Collectors of a second launch join a running job over a network, then leave it: does intake
follow them?

Two network namespaces stand in for two nodes (harness/testing/netns.py;
root and iproute2 needed). On the first, a 1 trainer + 2 collector job (async
PPO on ``slow_env:SlowCartPole-v0``, whose steps sleep ``--step-s``: collectors
that cost time, not CPU, as a pool of slow simulators) with
``topology.join_port``; on the second, a second launch of ``--joiners``
collectors (``harness join``) that joins after the first phase and
leaves (SIGTERM) after the second. Intake in each phase is the frames the
trainer learned from over its training time (two rows of ``metrics.csv``
``--phase-s`` apart); the trainer's process id is read before and after.

    python benchmarks/join.py --json /tmp/join.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.testing import netns

ROOT = Path(__file__).resolve().parents[1]
PORT = 29480


def rows(run: Path) -> list[dict[str, str]]:
    if not (run / "metrics.csv").exists():
        return []
    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def wait_rows(run: Path, count: int, timeout: float = 300) -> list[dict[str, str]]:
    deadline = time.monotonic() + timeout
    while len(table := rows(run)) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{run}: fewer than {count} rows after {timeout} s")
        time.sleep(0.5)
    return table


def phase(run: Path, seconds: float) -> float:
    """Frames learned per second of training over the next ``seconds``."""
    first = rows(run)[-1]
    time.sleep(seconds)
    last = rows(run)[-1]
    return (int(last["frames"]) - int(first["frames"])) / (
        float(last["time_s"]) - float(first["time_s"])
    )


def trainer_pid(launcher: int) -> int:
    """The job's rank 0 among the processes under ``launcher``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"RANK=0" in environ:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == launcher:
                    return int(entry.name)
    raise LookupError("the job's trainer")


def wait_for_joined(run: Path, timeout: float = 120) -> None:
    """Until the run's last rows count frames from joined collectors."""
    deadline = time.monotonic() + timeout
    while not any(float(r.get("collect/joined_fraction") or 0) > 0 for r in rows(run)[-2:]):
        if time.monotonic() > deadline:
            raise TimeoutError("no joined collector's frames arrived")
        time.sleep(0.5)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--joiners", type=int, default=2)
    parser.add_argument("--step-s", type=float, default=0.0025, help="seconds an env step sleeps")
    parser.add_argument(
        "--phase-s", type=float, default=30.0, help="seconds each phase is measured"
    )
    parser.add_argument("--json", help="write the result here")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    variables = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'benchmarks'}",
        "SLOW_STEP_S": str(args.step_s),
        "SLOW_RANK": "none",
    }
    torchrun = str(Path(sys.executable).parent / "torchrun")
    with tempfile.TemporaryDirectory() as tmp, netns.two_nodes("join") as (head, other):
        run = Path(tmp) / "run"
        job_cmd = [
            torchrun, "--standalone", "--nproc_per_node=3", "-m", "harness.train",
            "env.id=slow_env:SlowCartPole-v0", "collector.mode=async", f"topology.join_port={PORT}",
            "collector.total_frames=1000000000", "logger.log_every_frames=2048",
            "logger.console=false", "checkpoint.every_frames=0", f"run_dir={run}",
        ]  # fmt: skip
        job = subprocess.Popen(
            head.run(job_cmd), cwd=tmp, env={**variables, **head.env()}, stdout=subprocess.DEVNULL
        )
        try:
            wait_rows(run, 3)
            trainer = trainer_pid(job.pid)
            before = phase(run, args.phase_s)
            join_cmd = other.run(
                [sys.executable, "-m", "harness.cli.join", f"{head.address}:{PORT}"]
            )
            joiners = [
                subprocess.Popen(
                    join_cmd, cwd=tmp, env={**variables, **other.env()}, stdout=subprocess.DEVNULL
                )
                for _ in range(args.joiners)
            ]
            wait_for_joined(run)
            time.sleep(3)  # every joined collector sending
            joined = phase(run, args.phase_s)
            share = float(rows(run)[-1]["collect/joined_fraction"])
            for joiner in joiners:
                joiner.send_signal(signal.SIGTERM)
            codes = [joiner.wait(timeout=120) for joiner in joiners]
            time.sleep(3)
            after = phase(run, args.phase_s)
            same_trainer = trainer_pid(job.pid) == trainer
        finally:
            job.send_signal(signal.SIGTERM)
            job.wait(timeout=120)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "frames_per_s": {"before": before, "joined": joined, "after": after},
        "joined_over_before": joined / before,
        "after_over_before": after / before,
        "joined_share_last_row": share,
        "joiners_exit_codes": codes,
        "trainer_pid_unchanged": same_trainer,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
