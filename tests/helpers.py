"""What the tests share: launching the harness for real, reading what a run
wrote, composing configs, and bounded waits."""

from __future__ import annotations

import csv
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from tensordict import TensorDict

from harness.config import Config, load, register_configs

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
BIN = Path(sys.executable).parent
register_configs()


def launch_env(extra: dict | None = None) -> dict[str, str]:
    """The environment a launched job gets: this checkout first on the path,
    one thread per rank (several ranks share two cores here)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(extra or {})}


# One thread per rank, as launch_env's OMP_NUM_THREADS says. A single process
# would otherwise take every core (trainer.threads=auto), and on a loaded
# machine, as a test run's often is, OpenMP threads that spin for a core they
# cannot get make a run a hundred times slower.
ONE_THREAD = ["trainer.threads=1"]


def launcher(nproc: int = 1, restarts: int = 0) -> list[str]:
    """``python`` for one process, else the real ``torchrun`` for ``nproc`` ranks."""
    if nproc == 1:
        return [sys.executable]
    return [
        str(BIN / "torchrun"),
        "--standalone",
        f"--nproc_per_node={nproc}",
        f"--max-restarts={restarts}",
    ]


def run_harness(
    args: list[str],
    cwd: Path,
    nproc: int = 1,
    timeout: float = 300,
    env: dict | None = None,
    module: str = "harness.train",
) -> subprocess.CompletedProcess:
    """``python -m harness.train`` (nproc 1: with one thread) or ``torchrun ... -m harness.train``
    with ``args``, to the end."""
    if (
        nproc == 1
        and module == "harness.train"
        and not any(a.startswith("trainer.threads=") for a in args)
    ):
        args = [*args, *ONE_THREAD]  # last: flags such as Hydra's -m come first
    return subprocess.run(
        [*launcher(nproc), "-m", module, *args],
        cwd=cwd,
        env=launch_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_harness(
    args: list[str], cwd: Path, nproc: int = 3, restarts: int = 0, launch: bool = False
) -> subprocess.Popen:
    """The same, in the background (output merged), for tests that signal or kill it. ``launch``:
    through ``harness.cli.launch`` (torchrun's arguments), as ``scripts/train.sh`` starts a job."""
    start = launcher(nproc, restarts)
    if launch:
        start = [sys.executable, "-m", "harness.cli.launch", *start[1:]]
    return subprocess.Popen(
        [*start, "-m", "harness.train", *args],
        cwd=cwd,
        env=launch_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def rank_pid(launcher: subprocess.Popen, rank: int) -> int:
    """The pid of the worker with RANK=rank among torchrun's children."""
    children = subprocess.run(
        ["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True
    ).stdout.split()
    for pid in children:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return int(pid)
    raise AssertionError(f"no worker with RANK={rank} among {children}")


def snapshot(run_dir: Path) -> dict[str, str]:
    """Every file under ``run_dir`` with the hash of its bytes, the lock file's included: a
    refused launch changes none of them."""
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(Path(run_dir).rglob("*"))
        if p.is_file()
    }


def rows(run_dir: Path) -> list[dict[str, str]]:
    """``metrics.csv`` of a run directory, one dict per row."""
    with (Path(run_dir) / "metrics.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def column(table: list[dict[str, str]], key: str) -> list[float]:
    """One column's values as floats, skipping rows without it (and ``nan``s)."""
    return [float(r[key]) for r in table if r.get(key) not in (None, "", "nan")]


def compose_config(*overrides: str) -> Config:
    """The typed config that ``python -m harness.train <overrides>`` would run with."""
    with initialize_config_dir(version_base=None, config_dir=str(CONF)):
        return load(compose("config", overrides=list(overrides)))


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def pendulum_frames(n: int = 64) -> list[TensorDict]:
    """``n`` random Pendulum transitions as one collector's batch, for an off-policy ``update``."""
    frames = TensorDict(
        obs=torch.randn(n, 3),
        action=torch.rand(n, 1) * 4 - 2,
        reward=torch.randn(n),
        next_obs=torch.randn(n, 3),
        terminated=torch.zeros(n, dtype=torch.bool),
        batch_size=[n],
    )
    return [TensorDict(rollout=frames.unsqueeze(1), batch_size=[])]
