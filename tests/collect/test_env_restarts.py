"""An env that raises, or breaks without raising, does not end the run: its collector makes it
again. One that hangs ends its collector, named."""

from __future__ import annotations

import flaky_env
import gymnasium as gym
import numpy as np
import pytest
from helpers import ROOT, column, compose_config, rows, run_harness

from harness.algos import ALGOS
from harness.collect.envs import make_vec_env, observation_problem, spec_of
from harness.collect.rollout import RolloutCollector
from harness.sync import Header

FLAKY = "flaky_env:FlakyCartPole-v0"
ON_PATH = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}


@pytest.mark.unit
def test_a_broken_episode_is_dropped_and_every_other_frame_counted(monkeypatch):
    monkeypatch.setenv("FLAKY_STEP", "10")
    monkeypatch.setenv("FLAKY_FAILURES", "1")
    monkeypatch.setattr(flaky_env, "failures", 0)
    cfg = compose_config("debug=tiny")
    envs = make_vec_env(FLAKY, 1, max_restarts=1)
    policy = ALGOS["ppo"].make_policy(cfg.algo, spec_of(envs))
    collector = RolloutCollector(envs, policy, 200, seed=1)
    stats = collector.collect(Header(version=0))["stats"]
    assert float(stats["env_restarts"]) == 1 and flaky_env.failures == 1
    # Every frame is in a finished episode, the broken one (10 frames: 9 steps and
    # the one that raised, stored as a truncation), or the episode still running.
    assert float(stats["length_sum"]) + 10 + int(collector.episode_length[0]) == 200
    assert float(stats["episodes"]) >= 1  # the other episodes still count


@pytest.mark.e2e
def test_a_run_goes_on_when_an_env_raises_and_counts_the_restart(workdir):
    out = run_harness(
        ["debug=tiny", f"env.id={FLAKY}", "logger.console=false", "run_dir=run"],
        workdir,
        nproc=3,
        env={**ON_PATH, "FLAKY_STEP": "10", "FLAKY_FAILURES": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    table = rows(workdir / "run")
    assert int(table[-1]["frames"]) == 1024
    assert sum(column(table, "collect/env_restarts")) == 2  # one in each collector's process
    assert (
        f"env {FLAKY} (seed" in out.stdout + out.stderr
        and "simulated crash at step 10" in out.stdout + out.stderr
    )


@pytest.mark.e2e
def test_an_env_that_keeps_raising_ends_the_run_naming_it_and_its_seed(workdir):
    out = run_harness(
        ["debug=tiny", f"env.id={FLAKY}", "collector.max_env_restarts=2", "run_dir=run"],
        workdir,
        env={**ON_PATH, "FLAKY_STEP": "5", "FLAKY_FAILURES": "1000"},
    )
    assert out.returncode != 0
    assert (
        f"env {FLAKY} (seed" in out.stderr
        and "raised 3 times, more than collector.max_env_restarts=2" in out.stderr
    )


@pytest.mark.e2e
@pytest.mark.parametrize(
    "mode, problem",
    [
        ("nan", "returned an observation that is not finite: [ 0. nan  0.  0.]"),
        ("shape", "returned an observation of shape (5,)"),
    ],
)
def test_an_env_that_breaks_without_raising_is_made_again_named_and_counted(workdir, mode, problem):
    out = run_harness(
        ["debug=tiny", f"env.id={FLAKY}", "logger.console=false", "run_dir=run"],
        workdir,
        nproc=3,
        env={**ON_PATH, "FLAKY_MODE": mode, "FLAKY_STEP": "10", "FLAKY_FAILURES": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    table = rows(workdir / "run")
    assert int(table[-1]["frames"]) == 1024
    assert sum(column(table, "collect/env_restarts")) == 2  # one in each collector's process
    text = out.stdout + out.stderr  # the warnings are logged
    assert f"env {FLAKY} (seed" in text and "index 0, step 10 of its episode) " + problem in text


@pytest.mark.e2e
def test_an_env_that_keeps_returning_nan_ends_the_run_naming_it_its_index_seed_and_step(workdir):
    out = run_harness(
        ["debug=tiny", f"env.id={FLAKY}", "collector.max_env_restarts=2", "run_dir=run"],
        workdir,
        env={**ON_PATH, "FLAKY_MODE": "nan", "FLAKY_STEP": "5", "FLAKY_FAILURES": "1000"},
    )
    assert out.returncode != 0
    assert (
        f"env {FLAKY} (seed " in out.stderr
        and ", step 5 of its episode) broke 3 times" in out.stderr
    )
    assert (
        "more than collector.max_env_restarts=2; the last time it returned an observation that is "
        "not finite" in out.stderr
    )
    assert "probability tensor" not in out.stderr


@pytest.mark.e2e
def test_an_env_step_that_never_returns_ends_its_collector_naming_the_env(workdir):
    out = run_harness(
        ["debug=tiny", f"env.id={FLAKY}", "collector.env_step_timeout_s=2", "run_dir=run"],
        workdir,
        nproc=3,
        env={**ON_PATH, "FLAKY_MODE": "hang", "FLAKY_STEP": "5", "FLAKY_FAILURES": "1"},
        timeout=300,
    )
    assert out.returncode != 0
    # Rank 1's envs take seeds 3 and 4 (seed 1 + rank * num_envs); its first env is the first to
    # hang.
    assert (
        "collector rank 1 (pid " in out.stderr
        and f"env {FLAKY} (seed 3, index 0, step 5 of its episode) has not returned after "
        "collector.env_step_timeout_s=2 s"
        in out.stderr
    ), out.stderr[-3000:]


@pytest.mark.unit
def test_observations_are_checked_for_shape_dtype_and_finiteness():
    space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    assert observation_problem(np.zeros(2, np.float32), space) is None
    assert (
        observation_problem(np.zeros(2, np.float64), space) is None
    )  # gymnasium casts a float64 down
    assert (
        observation_problem(np.zeros(3, np.float32), space)
        == "an observation of shape (3,), where its observation space has (2,)"
    )
    assert "dtype complex64" in str(observation_problem(np.zeros(2, np.complex64), space))
    assert "not finite: [inf  0.]" in str(
        observation_problem(np.array([np.inf, 0.0], np.float32), space)
    )
