"""Shared helpers: spawn real gloo ranks, run the real launcher."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run_harness(args: list[str], cwd: Path, nproc: int = 1, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m harness.train`` (nproc 1) or ``torchrun`` with ``args``."""
    if nproc == 1:
        cmd = [sys.executable, "-m", "harness.train", *args]
    else:
        cmd = [str(BIN / "torchrun"), "--standalone", f"--nproc_per_node={nproc}", "-m", "harness.train", *args]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def wait_for(condition, timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Runs happen in a temporary directory (MuJoCo and runs/ write into the cwd)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
