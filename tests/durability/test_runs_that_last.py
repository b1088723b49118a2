"""Checkpoints, resume, preemption and killed ranks, through the real launcher."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import rank_pid, rows, run_harness, snapshot, start_harness, wait_for

from harness.core import checkpoint
from harness.metrics.logger import CSVLog, MetricsWriteError
from harness.sync.shm_files import PREFIX

pytestmark = pytest.mark.e2e
TINY = ["debug=tiny", "logger.console=false"]


def frames_column(run_dir: Path) -> list[int]:
    return [int(r["frames"]) for r in rows(run_dir)]


def steps(run_dir: Path) -> list[str]:
    return sorted(p.name for p in checkpoint.checkpoint_dir(run_dir).glob("step-*"))


def test_checkpoints_are_written_atomically_and_only_the_newest_kept(workdir):
    out = run_harness(
        [*TINY, "checkpoint.every_frames=256", "checkpoint.keep=2", "run_dir=run"], workdir, nproc=3
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert steps(workdir / "run") == ["step-000000000768", "step-000000001024"]
    assert not list((workdir / "run" / "checkpoints").glob(".tmp-*"))
    state = torch.load(workdir / "run/checkpoints/step-000000001024/state.pt", weights_only=True)
    assert {"loss", "optimizer"} <= set(state["algo"]) and len(state["rng"]) == 1


def test_same_command_resumes_and_every_frame_range_is_logged_once(workdir):
    first = run_harness([*TINY, "checkpoint.every_frames=256", "run_dir=run"], workdir, nproc=3)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_harness(
        [*TINY, "checkpoint.every_frames=256", "collector.total_frames=2048", "run_dir=run"],
        workdir,
        nproc=3,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout + second.stderr
    table = rows(workdir / "run")
    assert [int(r["frames"]) for r in table] == list(range(256, 2049, 256))
    versions = [int(r["sync/version"]) for r in table]
    assert versions == sorted(versions) and versions[-1] == 16  # 2048 frames / 128 a round


def test_corrupt_newest_checkpoint_is_skipped_with_a_warning_naming_it(workdir):
    """...and the run resumes from the one before it, whose step ends a row: checkpoints every 384
    frames and rows every 512 do not meet by themselves, yet no frame range is left in no row."""
    every = ["checkpoint.every_frames=384", "logger.log_every_frames=512"]
    out = run_harness([*TINY, *every, "run_dir=run"], workdir, nproc=1)
    assert out.returncode == 0, out.stderr[-3000:]
    newest = workdir / "run/checkpoints/step-000000001024"
    data = (newest / "state.pt").read_bytes()
    (newest / "state.pt").write_bytes(data[: len(data) // 2])  # truncated, as by a full disk
    out = run_harness(
        [*TINY, *every, "collector.total_frames=1536", "run_dir=run"], workdir, nproc=1
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert f"skipping checkpoint {newest}" in text and "step-000000000768" in text
    frames = frames_column(workdir / "run")
    assert 768 in frames and frames == sorted(set(frames)), frames


def test_run_dir_that_is_not_writable_is_a_clear_error(workdir):
    (workdir / "a_file").write_text("")
    out = run_harness([*TINY, f"run_dir={workdir / 'a_file' / 'run'}"], workdir, nproc=1)
    assert out.returncode != 0 and "is not writable" in out.stdout + out.stderr


LONG_FRAMES = 20480  # ten checkpoints: still training when the first one is seen
LONG = [
    *TINY,
    f"collector.total_frames={LONG_FRAMES}",
    "checkpoint.every_frames=2048",
    "logger.log_every_frames=1024",
    "dist_timeout_s=20",
    "sync.timeout_s=20",
]


def test_sigterm_checkpoints_within_seconds_and_the_same_command_resumes(workdir):
    args = [*LONG, "run_dir=run"]
    job = start_harness(args, workdir)
    wait_for(lambda: steps(workdir / "run"), 60, "the first checkpoint")
    before = set(steps(workdir / "run"))
    job.send_signal(signal.SIGTERM)  # what SLURM does on preemption; torchrun forwards it
    wait_for(lambda: set(steps(workdir / "run")) - before, 60, "a checkpoint after SIGTERM")
    job.communicate(timeout=60)
    stopped_at = int(steps(workdir / "run")[-1].split("-")[1])
    assert stopped_at < LONG_FRAMES
    again = start_harness(args, workdir)
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out[-3000:]
    assert f"frames {stopped_at}" in out  # "resumed from ...: frames N"
    frames = frames_column(workdir / "run")
    assert frames == sorted(set(frames)) and frames[-1] == LONG_FRAMES


def test_sigterm_during_start_up_stops_cleanly_at_the_first_update_and_the_run_resumes(workdir):
    args = [*TINY, "checkpoint.every_frames=2048", "run_dir=run"]
    job = start_harness(args, workdir, launch=True)  # as scripts/train.sh starts it
    wait_for(lambda: (workdir / "run/config.yaml").exists(), 120, "config.yaml: start-up under way")
    job.send_signal(
        signal.SIGTERM
    )  # a scheduler's preemption; the launcher passes it on to every rank
    out, _ = job.communicate(timeout=120)
    assert job.returncode == 128 + signal.SIGTERM, out[-3000:]
    # The first update after the signal reached trainer 0 (128 frames a round): the first round's,
    # or, where start-up ran past the first update's check before the launcher passed the signal on,
    # a later one.
    stopped = re.search(r"preempted at frames (\d+): checkpoint written", out)
    assert stopped is not None, out[-3000:]
    at = int(stopped.group(1))
    assert at % 128 == 0 and at < 1024, out[-3000:]
    assert "Traceback" not in out and "Error executing job" not in out, out[-3000:]
    assert steps(workdir / "run") == [f"step-{at:012d}"]
    again = run_harness(args, workdir, nproc=3)
    assert again.returncode == 0 and "resumed from" in again.stdout + again.stderr, again.stderr[
        -3000:
    ]
    frames = frames_column(workdir / "run")
    # The stopped launch's last row at its stop, the resumed one's from there: every frame range
    # once.
    assert (
        frames[0] == min(at, 256)
        and at in frames
        and frames == sorted(set(frames))
        and frames[-1] == 1024
    )


def test_killed_collector_is_restarted_by_torchrun_and_the_run_finishes_clean(workdir):
    before = set(Path("/dev/shm").glob(f"{PREFIX}*"))
    # async: the trainer's drain waits for any collector's goodbye, which a dead one never sends
    args = [*LONG, "sync=shm", "collector.mode=async", "run_dir=run"]
    job = start_harness(args, workdir, restarts=1, launch=True)
    wait_for(lambda: steps(workdir / "run"), 60, "the first checkpoint")
    os.kill(rank_pid(job, 2), signal.SIGKILL)
    out, _ = job.communicate(timeout=300)
    assert job.returncode == 0, out[-3000:]
    # The death is named when it happens, before the restart resumes: by torchrun's line for rank
    # 2, or, when the trainer's receive fails on the closed connection first (a race: torchrun then
    # reports rank 0's exit as the first failure), by the trainer's error.
    named = [out.find("failed (exitcode: -9) local_rank: 2"), out.find("one of them is gone")]
    named = [at for at in named if at >= 0]
    assert named and min(named) < out.find("resumed from"), out[-3000:]
    # the other ranks stop on torchrun's SIGTERM: none is left for its SIGKILL 30 s later
    assert "forcefully exiting via 9" not in out, out[-3000:]
    frames = frames_column(workdir / "run")
    assert frames == sorted(set(frames)) and frames[-1] == LONG_FRAMES
    wait_for(
        lambda: set(Path("/dev/shm").glob(f"{PREFIX}*")) <= before,
        10,
        "the run's shm segments to be removed",
    )


def test_replay_buffer_travels_in_the_checkpoint_when_asked(workdir):
    args = [
        "experiment=sac_pendulum",
        "collector.total_frames=640",
        "algo.learning_starts=256",
        "algo.batch_size=16",
        "algo.update_to_data=0.1",
        "eval.every_frames=0",
        "checkpoint.replay_buffer=true",
        "logger.console=false",
        "logger.log_every_frames=320",
        "run_dir=run",
    ]
    assert run_harness(args, workdir, nproc=1).returncode == 0
    state = torch.load(workdir / "run/checkpoints/step-000000000640/state.pt", weights_only=True)
    assert state["replay"]["size"] == 640
    out = run_harness([*args[:1], "collector.total_frames=960", *args[2:]], workdir, nproc=1)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(rows(workdir / "run")[-1]["train/replay_size"]) == 960  # 640 restored + 320 new


@pytest.fixture
def small_disk(workdir):
    """A real 4 MiB tmpfs at ``workdir/disk``: a filesystem that fills up. Needs root and
    mount(2)."""
    disk = workdir / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"a small tmpfs needs root and mount(2): {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_is_named_the_partial_checkpoint_removed_and_the_earlier_ones_kept(
    workdir, small_disk
):
    args = [
        *TINY,
        "checkpoint.every_frames=256",
        "checkpoint.keep=2",
        f"run_dir={small_disk / 'run'}",
    ]
    first = run_harness(args, workdir)
    assert first.returncode == 0, first.stderr[-3000:]
    kept = {k: v for k, v in snapshot(small_disk / "run").items() if k.startswith("checkpoints/")}
    filler = small_disk / "filler"
    with filler.open(
        "wb"
    ) as f:  # leave room for the config and metrics rows, not for a ~130 kB checkpoint
        f.write(b"\0" * (shutil.disk_usage(small_disk).free - 48 * 1024))
    full = run_harness([*args, "collector.total_frames=2048"], workdir)
    text = full.stdout + full.stderr
    assert full.returncode != 0
    assert "step-000000001280 cannot be written: the disk is full (about " in text, text[-3000:]
    assert " bytes needed, " in text and f" bytes free in {small_disk / 'run/checkpoints'})" in text
    assert "earlier checkpoints are kept (step-000000000768, step-000000001024)" in text
    assert not list(checkpoint.checkpoint_dir(small_disk / "run").glob(".tmp-*"))
    assert {
        k: v for k, v in snapshot(small_disk / "run").items() if k.startswith("checkpoints/")
    } == kept
    filler.unlink()  # room again: the same command resumes from the newest kept checkpoint
    again = run_harness([*args, "collector.total_frames=2048"], workdir)
    assert again.returncode == 0 and "step-000000001024" in again.stdout + again.stderr, (
        again.stderr[-3000:]
    )


def test_metrics_csv_on_a_full_disk_keeps_every_row_whole_and_says_so(small_disk):
    # Rows wider than a page: tmpfs gives a file whole pages, so a short row would still fit.
    def row(frames: int, **more: float) -> dict[str, float]:
        return {"frames": frames, **{f"train/m{i}": 0.123456789 for i in range(500)}, **more}

    log = CSVLog(small_disk / "run" / "metrics.csv")
    for frames in (256, 512):
        log.write(row(frames))
    before = (small_disk / "run" / "metrics.csv").read_bytes()
    filler = small_disk / "filler"
    with filler.open("wb") as f:  # every free byte
        f.write(b"\0" * shutil.disk_usage(small_disk).free)
    for new in (row(768), row(768, **{"train/new": 1.0})):  # appended; the file rewritten
        with pytest.raises(MetricsWriteError, match="cannot be written: the disk is full"):
            log.write(new)
        assert (small_disk / "run" / "metrics.csv").read_bytes() == before
    assert [p.name for p in (small_disk / "run").iterdir()] == ["metrics.csv"]  # no partial file
    filler.unlink()
    log.write(row(768, **{"train/new": 1.0}))
    assert [r["frames"] for r in rows(small_disk / "run")] == ["256", "512", "768"]
