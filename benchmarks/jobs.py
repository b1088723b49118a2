"""A benchmark's training job: ``torchrun ... -m harness.train`` in a temporary run directory, its
rows back."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def job_command(nproc: int, overrides: list[str], run_dir: str) -> list[str]:
    """``torchrun ... -m harness.train`` of this checkout with ``overrides``, quiet, without
    checkpoints, in ``run_dir``."""
    torchrun = str(Path(sys.executable).parent / "torchrun")
    quiet = ["logger.console=false", "checkpoint.every_frames=0", f"run_dir={run_dir}"]
    return [
        torchrun,
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "harness.train",
        *overrides,
        *quiet,
    ]


def job_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """Every process with one thread, this checkout and ``benchmarks/`` (its envs) importable."""
    paths = f"{ROOT}{os.pathsep}{ROOT / 'benchmarks'}"
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": paths, **(env or {})}


def run_job(
    nproc: int,
    overrides: list[str],
    env: dict[str, str] | None = None,
    timeout: float | None = 3600,
    keep: Path | None = None,
) -> list[dict[str, str]]:
    """One launch of this checkout's harness (every process with one thread, ``benchmarks/``
    importable for its envs) with ``overrides``; the rows of its metrics.csv, the first one
    (start-up) left out. ``keep``: a directory to copy the run's metrics.csv and config.yaml
    into."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = job_command(nproc, overrides, f"{tmp}/run")
        variables = job_env(env)
        out = subprocess.run(
            cmd, cwd=tmp, env=variables, capture_output=True, text=True, timeout=timeout
        )
        if out.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
        if keep:
            keep.mkdir(parents=True, exist_ok=True)
            for name in ("metrics.csv", "config.yaml"):
                shutil.copy(f"{tmp}/run/{name}", keep / name)
        with open(f"{tmp}/run/metrics.csv", newline="") as f:
            return list(csv.DictReader(f))[1:]
