"""Sweeps (``-m``) through the front door, ``scripts/train.sh`` with torchrun's ranks: every job
trains, each with its own rendezvous, and the launch makes one sweep directory, whatever each rank's
clock says."""

from __future__ import annotations

import subprocess
from datetime import timedelta

import pytest
import torch.distributed as dist
from helpers import ROOT, launch_env, rows, run_harness

from harness.distributed import launch_stamp

TRAIN_SH = str(ROOT / "scripts" / "train.sh")


@pytest.mark.e2e
def test_a_sweep_under_torchrun_trains_every_job_into_one_sweep_directory(workdir):
    out = subprocess.run(
        [
            TRAIN_SH,
            "-m",
            "seed=1,2",
            "debug=tiny",
            "logger.console=false",
            f"runs_root={workdir / 'runs'}",
        ],
        cwd=workdir,
        env=launch_env({"NPROC": "3"}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    said = out.stdout + out.stderr
    assert out.returncode == 0, said[-5000:]
    assert "connectFullMesh" not in said and "Traceback" not in said, said[-5000:]
    sweeps = sorted((workdir / "runs").iterdir())
    assert len(sweeps) == 1 and sweeps[0].name.startswith("sweep-"), (
        sweeps
    )  # one directory, whatever the ranks' clocks
    jobs = sorted(p.parent for p in sweeps[0].glob("*/metrics.csv"))
    assert [p.name for p in jobs] == [
        "debug=tiny,logger.console=False,seed=1",
        "debug=tiny,logger.console=False,seed=2",
    ]
    for job, seed in zip(jobs, (1, 2)):
        assert int(rows(job)[-1]["frames"]) == 1024, job  # each job trained to its end
        assert f"seed: {seed}" in (job / "config.yaml").read_text()


@pytest.fixture
def agent_store(monkeypatch):
    """A real TCPStore where torchrun's agent would host it, and the variables torchrun gives its
    ranks."""
    store = dist.TCPStore(
        "127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False
    )
    for name in ("SLURM_JOB_ID", launch_stamp.STAMP_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    return store


@pytest.mark.unit
def test_every_rank_and_every_restart_reads_the_first_ranks_stamp_from_torchruns_store(
    agent_store, monkeypatch
):
    clocks = iter(
        ["20260101-120059", "20260101-120100", "20260101-120101"]
    )  # three ranks across a second boundary
    monkeypatch.setattr(launch_stamp, "clock", lambda: next(clocks))
    assert [launch_stamp.launch_stamp() for _ in range(3)] == ["20260101-120059"] * 3
    monkeypatch.setenv(
        "TORCHELASTIC_RESTART_COUNT", "1"
    )  # a restarted attempt: the key is not the attempt's
    monkeypatch.setattr(launch_stamp, "clock", lambda: "20260101-130000")
    assert launch_stamp.launch_stamp() == "20260101-120059"


@pytest.mark.unit
def test_a_slurm_job_is_named_by_its_id_and_the_environment_names_any_launch(
    agent_store, monkeypatch
):
    monkeypatch.setenv(
        "SLURM_JOB_ID", "4242"
    )  # before torchrun's store: a requeued job has a new store and clock
    assert launch_stamp.launch_stamp() == "slurm4242"
    monkeypatch.setenv(launch_stamp.STAMP_ENV, "mine")
    assert launch_stamp.launch_stamp() == "mine"
    assert launch_stamp.shared()
    for name in ("SLURM_JOB_ID", launch_stamp.STAMP_ENV, "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(name)
    monkeypatch.setattr(launch_stamp, "clock", lambda: "20260101-120000")
    assert (
        launch_stamp.launch_stamp() == "20260101-120000" and not launch_stamp.shared()
    )  # one process: its own clock


@pytest.mark.unit
def test_a_store_that_is_gone_is_a_clear_error_naming_the_way_out(monkeypatch):
    monkeypatch.setattr(launch_stamp, "STORE_TIMEOUT_S", 0.5)
    port = dist.TCPStore(
        "127.0.0.1", 0, None, True, wait_for_workers=False
    ).port  # closed at once: nothing listens
    with pytest.raises(
        RuntimeError,
        match=f"could not reach torchrun's store at 127.0.0.1:{port}.*{launch_stamp.STAMP_ENV}=",
    ):
        launch_stamp._from_store("127.0.0.1", port, "20260101-120000")


@pytest.mark.e2e
def test_a_named_sweep_is_its_directory_and_the_same_sweep_command_resumes_every_job(workdir):
    args = [
        "-m",
        "seed=1,2",
        "run_name=study",
        "debug=tiny",
        "logger.console=false",
        "checkpoint.every_frames=512",
    ]
    first = run_harness(args, workdir)
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_harness(args, workdir)
    said = again.stdout + again.stderr
    assert again.returncode == 0, said[-3000:]
    jobs = sorted(p.parent for p in (workdir / "runs" / "study").glob("*/metrics.csv"))
    assert [[kv for kv in p.name.split(",") if kv.startswith("seed=")] for p in jobs] == [
        ["seed=1"],
        ["seed=2"],
    ]
    for job in jobs:  # each job found its own run directory again and continued it
        assert f"resumed from {job.resolve()}/checkpoints/step-000000001024" in said, said[-3000:]
        assert [int(r["frames"]) for r in rows(job)] == [256, 512, 768, 1024]
    assert [p.name for p in (workdir / "runs").iterdir()] == ["study"]
