"""The GPU machine's install, rehearsed here (harness gpu-check --rehearse does all of it, dry run
included; docs/gpu.md): a wheelhouse made by the same code for this Python, installed with
``pip install --no-index --no-deps --target`` into a fresh virtual environment that holds only
torch and the GPU image's packages, then the harness run from it. Needs the package index (pip's
configured one) for the wheelhouse; the install itself is offline. Cannot prove CUDA, the GPU
image's torch 2.11, or the cp312 wheels themselves (their names are checked in
test_wheelhouse.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

from harness.cli.gpu_check import prepare, wheelhouse
from harness.cli.gpu_check.rehearse import image_like_venv, isolated_env

pytestmark = pytest.mark.e2e
HARNESS_NEEDS = ("tensordict", "hydra", "omegaconf", "gymnasium", "ale_py")


def run(python: Path, *args: str, site: Path | None = None) -> subprocess.CompletedProcess:
    paths = f"{ROOT}:{site}" if site else str(ROOT)
    env = isolated_env(PYTHONPATH=paths, OMP_NUM_THREADS="1")
    return subprocess.run(
        [str(python), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_wheelhouse_installs_offline_into_a_python_with_only_the_images_packages_and_runs(
    tmp_path,
):
    here = sys.version_info[:2]
    wheels, site = tmp_path / "wheelhouse", tmp_path / "site"
    wheelhouse.fetch(sys.executable, wheels, here)  # the index: the one step that needs it
    assert wheelhouse.problems(wheelhouse.sizes(wheels), 0, here) == []

    python = image_like_venv(tmp_path / "venv")
    # The venv sees torch and the image's packages, none of what the wheelhouse brings.
    assert prepare.missing(str(python), ("torch", "numpy", "cv2", "pytest"), isolated_env()) == []
    assert prepare.missing(str(python), HARNESS_NEEDS, isolated_env()) == list(HARNESS_NEEDS)

    assert prepare.install(str(python), site, wheels)  # --no-index --no-deps --target
    located = run(python, "-c", "import tensordict, hydra; print(tensordict.__file__)", site=site)
    assert located.returncode == 0, located.stderr
    assert located.stdout.strip().startswith(str(site))

    # The check's step 0 collects there, and a short run trains: Hydra, OmegaConf, tensordict
    # and gymnasium from the wheelhouse; Breakout's ROM from its ale-py.
    tier = run(
        python,
        "-m",
        "pytest",
        "tests/devices",
        "-m",
        "gpu",
        "-q",
        "-p",
        "no:cacheprovider",
        site=site,
    )
    assert tier.returncode == 0 and " skipped" in tier.stdout, tier.stdout[-2000:]
    trained = run(
        python,
        "-m",
        "harness.train",
        "debug=tiny",
        f"run_dir={tmp_path / 'run'}",
        "logger.console=false",
        "eval.every_frames=0",
        "trainer.threads=1",
        site=site,
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert (tmp_path / "run" / "metrics.csv").exists()
    breakout = "import gymnasium as g, ale_py; g.register_envs(ale_py); g.make('ALE/Breakout-v5')"
    atari = run(python, "-c", breakout, site=site)
    assert atari.returncode == 0, atari.stderr[-2000:]
