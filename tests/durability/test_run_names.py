"""Where runs go: default names that sort by time and say algo, env and seed; ``run_name=`` that the
same command resumes; a restarted attempt that finds its own directory again. Real launches through
torchrun."""

from __future__ import annotations

import os
import re
import signal

import pytest
from helpers import compose_config, rank_pid, rows, run_harness, snapshot, start_harness, wait_for

from harness.distributed.launch_stamp import STAMP_ENV
from harness.distributed.setup import resolve_run_dir
from harness.distributed.topology import Layout

TINY = ["debug=tiny", "logger.console=false", "checkpoint.every_frames=256"]
DEFAULT_NAME = re.compile(
    r"\d{8}-\d{6}-ppo-CartPole-v1-seed(\d+)"
)  # <launch time>-<algo>-<env id>-seed<seed>


@pytest.mark.unit
def test_a_default_name_starts_with_the_launch_time_and_says_algo_env_and_seed(monkeypatch):
    monkeypatch.setenv(STAMP_ENV, "20260101-120000")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    one = Layout.from_env(1, env={})
    assert (
        str(resolve_run_dir(None, "runs", None, "ppo-CartPole-v1-seed3", one))
        == "runs/20260101-120000-ppo-CartPole-v1-seed3"
    )
    assert (
        str(resolve_run_dir(None, "runs", None, "ppo-ALE/Pong-v5-seed1", one))
        == "runs/20260101-120000-ppo-ALE-Pong-v5-seed1"
    )
    assert str(resolve_run_dir(None, "runs", "mine", "ppo-CartPole-v1-seed3", one)) == "runs/mine"
    assert str(resolve_run_dir("/x/y", "runs", None, "ppo-CartPole-v1-seed3", one)) == "/x/y"


@pytest.mark.unit
@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["run_name=a/b"],
            "run_name='a/b': a run's name is one folder name under runs_root=runs; for a path, "
            "give run_dir=a/b",
        ),
        (["run_name=.."], "run_name='..': a run's name is one folder name"),
        (
            ["run_name=a", "run_dir=b"],
            "run_name=a and run_dir=b both name the run directory: give one of them",
        ),
    ],
)
def test_a_run_name_is_a_name_not_a_path(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        compose_config(*overrides)


@pytest.mark.e2e
def test_a_default_run_directory_sorts_by_time_and_names_algo_env_and_seed(workdir):
    out = run_harness([*TINY, "seed=3"], workdir, nproc=3)
    assert out.returncode == 0, out.stderr[-3000:]
    (run,) = (workdir / "runs").iterdir()  # one directory for the three ranks
    match = DEFAULT_NAME.fullmatch(run.name)
    assert match and match.group(1) == "3", run.name
    assert int(rows(run)[-1]["frames"]) == 1024


@pytest.mark.e2e
def test_the_same_run_name_command_resumes_and_other_settings_are_refused(workdir):
    args = [*TINY, "run_name=mine"]
    first = run_harness(args, workdir, nproc=3)
    assert first.returncode == 0, first.stderr[-3000:]
    run = workdir / "runs" / "mine"
    again = run_harness(args, workdir, nproc=3)
    said = again.stdout + again.stderr
    assert again.returncode == 0, said[-3000:]
    assert f"resumed from {run.resolve()}/checkpoints/step-000000001024: frames 1024" in said, said[
        -3000:
    ]
    assert [p.name for p in (workdir / "runs").iterdir()] == ["mine"]
    assert [int(r["frames"]) for r in rows(run)] == [256, 512, 768, 1024]  # every frame range once
    before = snapshot(run)
    refused = run_harness([*args, "seed=2"], workdir, nproc=3)
    assert refused.returncode != 0 and "seed: 1 -> 2" in refused.stdout + refused.stderr, (
        refused.stderr[-3000:]
    )
    assert snapshot(run) == before


@pytest.mark.e2e
def test_a_restarted_attempt_finds_its_default_run_directory_again_and_resumes(workdir):
    args = [
        *TINY,
        "collector.total_frames=20480",
        "checkpoint.every_frames=2048",
        "dist_timeout_s=20",
        "sync.timeout_s=20",
    ]
    job = start_harness(args, workdir, restarts=1)
    wait_for(lambda: list(workdir.glob("runs/*/checkpoints/step-*")), 120, "the first checkpoint")
    os.kill(
        rank_pid(job, 2), signal.SIGKILL
    )  # torchrun restarts the job: a new attempt, the same launch
    out, _ = job.communicate(timeout=300)
    assert job.returncode == 0, out[-3000:]
    (run,) = (workdir / "runs").iterdir()
    assert DEFAULT_NAME.fullmatch(run.name) and "resumed from" in out, out[-3000:]
    assert int(rows(run)[-1]["frames"]) == 20480
