"""A resume keeps what an update learns from: another NPROC that would change PPO's batch is
refused, naming both layouts and the fix; async collectors, which an update takes one batch at a
time, may change in number."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers import ROOT, compose_config, launch_env, rows, snapshot

from harness.distributed.topology import Layout
from harness.rundir import directory as run_directory
from harness.rundir.directory import LAYOUT_FILE, RunDirError, refuse_another_layout

TRAIN_SH = str(ROOT / "scripts" / "train.sh")
TINY = ["debug=tiny", "logger.console=false", "checkpoint.every_frames=256", "run_name=r"]


def train_sh(args: list[str], cwd, nproc: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TRAIN_SH, *TINY, f"runs_root={cwd / 'runs'}", *args],
        cwd=cwd,
        env=launch_env({"NPROC": str(nproc)}),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.e2e
def test_a_resume_with_another_nproc_that_would_change_the_batch_is_refused_naming_both_layouts(
    workdir,
):
    first = train_sh(["collector.total_frames=512"], workdir, nproc=3)
    assert first.returncode == 0, first.stderr[-3000:]
    run = workdir / "runs" / "r"
    assert json.loads((run / LAYOUT_FILE).read_text()) == {
        "world_size": 3,
        "trainers": 1,
        "collectors_per_trainer": 2,
    }
    before = snapshot(run)
    out = train_sh(["collector.total_frames=1024"], workdir, nproc=2)
    said = (out.stdout + out.stderr).strip()
    assert out.returncode == 2, said[-3000:]  # a mistake in the command: one message, no traceback
    assert said.startswith("error: ") and said.count("error:") == 1 and "Traceback" not in said, (
        said[-3000:]
    )
    assert "started with 3 ranks (1 trainer, 2 collectors each: 128 frames per update)" in said
    assert "this launch has 2 ranks (1 trainer, 1 collector each: 64 frames per update)" in said
    assert (
        "Relaunch with 3 ranks (harness train --nproc 3, or torchrun" in said
        and f"checkpoint.init_from={run.resolve()}" in said
    )
    assert snapshot(run) == before
    again = train_sh(
        ["collector.total_frames=1024"], workdir, nproc=3
    )  # the layout it started with: it goes on
    assert again.returncode == 0 and "resumed from" in again.stdout + again.stderr, again.stderr[
        -3000:
    ]
    assert [int(r["frames"]) for r in rows(run)] == [256, 512, 768, 1024]


def layout(world: int, trainers: int = 1) -> Layout:
    return Layout.from_env(trainers, env={"RANK": "0", "WORLD_SIZE": str(world)})


def started_with(run_dir, world: int, trainers: int = 1) -> None:
    run_dir.mkdir(exist_ok=True)
    (run_dir / LAYOUT_FILE).write_text(
        json.dumps(run_directory.layout_record(layout(world, trainers)))
    )


@pytest.mark.unit
def test_sync_rounds_keep_their_collectors_per_trainer_and_one_process_collects_for_itself(
    tmp_path,
):
    cfg = compose_config()  # PPO, sync rounds
    started_with(tmp_path, 3)
    refuse_another_layout(cfg, tmp_path, layout(3))
    with pytest.raises(RunDirError, match=r"started with 3 ranks .* this launch has 5 ranks"):
        refuse_another_layout(cfg, tmp_path, layout(5))
    started_with(
        tmp_path, 1
    )  # the one process is its own collector: the same batch as 1 trainer + 1 collector
    refuse_another_layout(cfg, tmp_path, layout(2))


@pytest.mark.unit
def test_async_collectors_may_change_in_number_but_trainers_may_not(tmp_path):
    cfg = compose_config("experiment=sac_pendulum", "algo.batch_size=256")
    started_with(tmp_path, 3)
    refuse_another_layout(
        cfg, tmp_path, layout(5)
    )  # streamed batches: an update learns from one at a time
    with pytest.raises(
        RunDirError, match=r"1 trainer, 2 collectors each\); this launch has 4 ranks \(2 trainers"
    ):
        refuse_another_layout(cfg, tmp_path, layout(4, trainers=2))


@pytest.mark.unit
def test_a_run_that_recorded_no_layout_resumes_as_before(tmp_path):
    refuse_another_layout(compose_config(), tmp_path, layout(5))


@pytest.mark.e2e
def test_an_async_run_resumes_with_fewer_collectors(workdir):
    args = ["experiment=sac_pendulum", "checkpoint.every_frames=512"]
    first = train_sh([*args, "collector.total_frames=1024"], workdir, nproc=3)
    assert first.returncode == 0, first.stderr[-3000:]
    again = train_sh([*args, "collector.total_frames=2048"], workdir, nproc=2)
    said = again.stdout + again.stderr
    assert again.returncode == 0 and "resumed from" in said and "frames 1024" in said, said[-3000:]
    assert int(rows(workdir / "runs" / "r")[-1]["frames"]) == 2048
