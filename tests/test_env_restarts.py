"""An env that raises does not end the run: its collector makes it again."""

from __future__ import annotations

import flaky_env
import pytest
from helpers import ROOT, column, compose_config, rows, run_harness

from harness.algos import ALGOS
from harness.collect.envs import make_vec_env, spec_of
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
    assert f"env {FLAKY} (seed" in out.stdout + out.stderr and "simulated crash at step 10" in out.stdout + out.stderr


@pytest.mark.e2e
def test_an_env_that_keeps_raising_ends_the_run_naming_it_and_its_seed(workdir):
    out = run_harness(
        ["debug=tiny", f"env.id={FLAKY}", "collector.max_env_restarts=2", "run_dir=run"],
        workdir,
        env={**ON_PATH, "FLAKY_STEP": "5", "FLAKY_FAILURES": "1000"},
    )
    assert out.returncode != 0
    assert f"env {FLAKY} (seed" in out.stderr and "raised 3 times, more than collector.max_env_restarts=2" in out.stderr
