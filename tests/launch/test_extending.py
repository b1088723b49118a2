"""docs/extending.md, proved end to end: an algorithm (tests/toy_algo.py), a weight sync scheme
(tests/toy_scheme.py) and an env (tests/toy_env.py) from outside the package train a job of one
trainer and two collectors through the real launcher, and the run's own metrics say that each of
them did its part."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import toy_env
from helpers import ROOT, column, launch_env, rows, run_harness
from omegaconf import OmegaConf

pytestmark = pytest.mark.e2e

TESTS = Path(__file__).resolve().parents[1]  # where the toy modules are
PLUGINS = "toy_algo,toy_scheme"  # the env needs none: env.id=<module>:<id> imports its module
TOY_JOB = ["algo=toy_pg", "sync=toy_store", "env.id=toy_env:ToyGuess-v0", "debug=tiny"]


def toy_env_vars(plugins: str) -> dict[str, str]:
    """The launch's environment: the toy modules importable, and ``HARNESS_PLUGINS=plugins``."""
    return launch_env({"PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}", "HARNESS_PLUGINS": plugins})


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> Path:
    """The toy job, run once for this module's tests: its run directory."""
    workdir = tmp_path_factory.mktemp("toy")  # the cwd too: runs write there
    run_dir = workdir / "run"
    launch = [sys.executable, "-m", "harness.cli.launch", "--standalone", "--nproc_per_node=3"]
    out = subprocess.run(
        [*launch, "-m", "harness.train", *TOY_JOB, f"run_dir={run_dir}"],
        cwd=workdir,
        env=toy_env_vars(PLUGINS),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return run_dir


def test_an_algorithm_a_scheme_and_an_env_from_outside_the_package_train_a_job(toy_run):
    saved = OmegaConf.load(toy_run / "config.yaml")
    assert (saved.algo.name, saved.sync.name) == ("toy_pg", "toy_store")
    table = rows(toy_run)
    assert int(table[-1]["frames"]) == 1024  # debug=tiny's budget, spent

    # The env: every episode lasted toy_env.LENGTH steps (CartPole's vary), and some ended in
    # every row.
    assert set(column(table, "train/episode_length")) == {toy_env.LENGTH}, table
    assert all(n > 0 for n in column(table, "train/episodes")), table

    # The scheme: a new version in every row, weights in every publish, and every round acted with
    # the newest version (sync rounds wait for it: a version that never came would time out).
    versions = column(table, "sync/version")
    assert len(versions) == len(table) and versions == sorted(set(versions)) and versions[0] > 0
    assert versions[-1] == column(table, "train/updates")[-1]  # one version per update
    assert min(column(table, "sync/bytes")) > 0
    assert column(table, "collect/policy_lag_max") == [0.0] * len(table)

    # The algorithm: it took its steps, and what the collectors acted with learned. A random policy
    # returns LENGTH / 2; the learned one's last rows return well above it.
    assert len(column(table, "train/pg_loss")) == len(table)
    returns = column(table, "train/episode_return")
    assert returns[-1] > returns[0] and sum(returns[-2:]) / 2 > toy_env.LENGTH / 2 + 1.5, returns


def test_harness_evaluate_plays_a_plugin_algorithm_s_checkpoint(toy_run):
    out = subprocess.run(
        [sys.executable, "-m", "harness", "evaluate", str(toy_run), "episodes=4"],
        cwd=toy_run.parent,
        env=toy_env_vars(PLUGINS),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "over 4 deterministic episodes" in out.stdout, out.stderr[-3000:]


@pytest.mark.parametrize(
    "plugins, refused",
    [("toy_scheme", "algo=toy_pg: no such option"), ("toy_algo", "sync=toy_store: no such option")],
    ids=["no-algorithm", "no-scheme"],
)
def test_without_its_plugin_a_name_is_refused(workdir, plugins, refused):
    """What the first test relies on: without ``HARNESS_PLUGINS`` naming its module, an algorithm
    or a scheme from outside the package is no choice at all (the failure that test would show)."""
    out = run_harness([*TOY_JOB, "run_dir=run"], workdir, env=toy_env_vars(plugins))
    assert out.returncode == 2 and refused in out.stderr, out.stderr[-3000:]
    assert not (workdir / "run").exists()
