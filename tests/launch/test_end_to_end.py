"""Whole runs through the real launchers, and a learning check that can fail."""

from __future__ import annotations

import re

import pytest
from helpers import rows, run_harness
from omegaconf import OmegaConf

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("scheme", ["gloo", "shm"])
def test_torchrun_one_trainer_two_collectors(workdir, scheme):
    out = run_harness(
        ["debug=tiny", f"sync={scheme}", f"run_dir={workdir / 'run'}"], workdir, nproc=3
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = workdir / "run"
    assert f"run_dir: {run_dir}" in out.stdout
    table = rows(run_dir)
    assert {"frames", "time_s", "train/episode_return", "sync/ms"} <= set(table[0])
    assert int(table[-1]["frames"]) == 1024  # stopped at collector.total_frames
    assert [int(r["frames"]) for r in table] == sorted(int(r["frames"]) for r in table)
    assert float(table[-1]["collect/policy_lag_max"]) == 0  # sync mode: round r acts with version r
    assert OmegaConf.load(run_dir / "config.yaml").collector.total_frames == 1024
    # The tuned file for algo=ppo env=cartpole says what it set, and which of its values debug=tiny
    # overrode.
    assert (
        "conf/tuned/ppo_cartpole.yaml (tuned for this algo and env) set: algo.ent_coef=0.0"
        in out.stdout
    )
    assert (
        "algo.lr=0.001" in out.stdout
        and "collector.num_envs=2 (tuned: 4, overridden)" in out.stdout
    )


def test_torchrun_default_run_dir_is_shared_and_named_after_the_job(workdir):
    out = run_harness(["debug=tiny", "sync=none"], workdir, nproc=2)
    assert out.returncode == 0, out.stderr[-3000:]
    dirs = list((workdir / "runs").iterdir())
    assert len(dirs) == 1 and re.fullmatch(r"\d{8}-\d{6}-ppo-CartPole-v1-seed1", dirs[0].name), dirs
    assert (dirs[0] / "metrics.csv").exists()


def test_layout_that_cannot_work_fails_before_start_up(workdir):
    out = run_harness(["debug=tiny", "topology.trainers=2"], workdir, nproc=1)
    assert out.returncode != 0
    assert "topology.trainers=2" in out.stderr + out.stdout


def test_bad_override_fails_with_the_key(workdir):
    out = run_harness(["collector.frames_per_batch=33"], workdir, nproc=1)
    assert out.returncode != 0 and "collector.frames_per_batch=33" in out.stderr + out.stdout


@pytest.mark.slow
def test_ppo_learns_cartpole_in_one_process(workdir):
    """Random play scores about 22; 60k frames of PPO should be far above."""
    out = run_harness(
        ["collector.total_frames=61440", "logger.log_every_frames=5120", "run_dir=run"],
        workdir,
        nproc=1,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    returns = [float(r["train/episode_return"]) for r in rows(workdir / "run")]
    assert max(returns[-3:]) > 150, returns


@pytest.mark.parametrize("preset", ["sac_halfcheetah", "td3_hopper", "ppo_halfcheetah"])
def test_mujoco_presets_run_a_few_thousand_frames(workdir, preset):
    extra = (
        []
        if preset.startswith("ppo")
        else ["algo.learning_starts=512", "algo.batch_size=32", "algo.update_to_data=0.1"]
    )
    out = run_harness(
        [
            f"experiment={preset}",
            "collector.total_frames=2048",
            "logger.log_every_frames=1024",
            "eval.every_frames=0",
            "logger.console=false",
            "run_dir=run",
            *extra,
        ],
        workdir,
        nproc=1,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(rows(workdir / "run")[-1]["frames"]) >= 2048
