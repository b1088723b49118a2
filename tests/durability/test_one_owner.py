"""A run directory has one owner at a time, and only a harness run's directory
becomes one: real launches through torchrun, real files compared by hash."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import launch_env, rank_pid, rows, run_harness, snapshot, start_harness, wait_for

from harness.core import checkpoint
from harness.rundir.lock import LOCK_NAME, RunLockError, take

TINY = ["debug=tiny", "logger.console=false"]
# Long enough to be still training at its first checkpoint; patient enough to be paused for a while.
RUNNING = [
    *TINY,
    "collector.total_frames=8192",
    "checkpoint.every_frames=1024",
    "dist_timeout_s=300",
    "sync.timeout_s=300",
]


def job_pids(job: subprocess.Popen) -> list[int]:
    """torchrun's agent and its workers."""
    children = subprocess.run(
        ["pgrep", "-P", str(job.pid)], capture_output=True, text=True
    ).stdout.split()
    return [job.pid, *map(int, children)]


@pytest.mark.e2e
def test_a_second_launch_on_a_running_run_is_refused_naming_it_and_changes_no_byte(workdir):
    run = workdir / "run"
    first = start_harness([*RUNNING, "run_dir=run"], workdir)
    wait_for(
        lambda: list(checkpoint.checkpoint_dir(run).glob("step-*")),
        120,
        "the first launch's first checkpoint",
    )
    owner = rank_pid(first, 0)
    paused = job_pids(first)
    for pid in (
        paused
    ):  # the first launch holds the lock, frozen, so that no byte moves while the second one tries
        os.kill(pid, signal.SIGSTOP)
    try:
        before = snapshot(run)
        second = run_harness([*RUNNING, "run_dir=run"], workdir, nproc=3, timeout=120)
        after = snapshot(run)
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
    text = second.stdout + second.stderr
    assert second.returncode != 0
    assert f"is in use by another launch (host {socket.gethostname()} pid {owner} since" in text
    assert "resumed from" not in text
    assert after == before  # the lock file too: the refused launch only read it
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out[-3000:]
    frames = [int(r["frames"]) for r in rows(run)]
    assert frames == list(range(256, 8193, 256))  # every frame range once: one launch wrote them


HOLD = (
    "import signal, sys; from pathlib import Path; from harness.rundir.lock import take; "
    "take(Path(sys.argv[1])).announce(); signal.pause()"
)


@pytest.mark.multiprocess
def test_the_lock_of_a_killed_owner_is_free_at_once(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], env=launch_env())
    try:
        lock_file = tmp_path / LOCK_NAME
        wait_for(
            lambda: lock_file.exists() and f"pid {owner.pid} " in lock_file.read_text(),
            60,
            "the owner to write its pid",
        )
        with pytest.raises(
            RunLockError, match=f"in use by another launch \\(host .* pid {owner.pid} since"
        ):
            take(tmp_path)
    finally:
        owner.kill()  # SIGKILL: no Python runs, only the kernel lets go
        owner.wait(timeout=60)
    lock = take(tmp_path)
    lock.announce()
    assert f"pid {os.getpid()} " in (tmp_path / LOCK_NAME).read_text()
    lock.release()


def a_folder_of_files(where: Path) -> Path:
    """What a user's folder holds: files, folders, a hidden file, and a config.yaml that is not a
    run's."""
    for name, text in {
        "notes.txt": "mine",
        "src/main.py": "print('hello')\n",
        "results/table.csv": "a,b\n1,2\n",
        ".hidden": "x",
        "config.yaml": "model: resnet\n",
    }.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(text)
    return where


def every_path(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.e2e
@pytest.mark.parametrize("start_over", ["false", "true"])
def test_a_folder_that_is_not_a_run_is_refused_naming_what_it_holds_and_nothing_moves(
    workdir, start_over
):
    folder = a_folder_of_files(workdir / "mine")
    paths, before = every_path(folder), snapshot(folder)
    out = run_harness(
        [*TINY, "run_dir=mine", f"checkpoint.start_over={start_over}"],
        workdir,
        nproc=2,
        timeout=120,
    )
    assert out.returncode != 0
    assert (
        "is not a run directory: it holds .hidden, config.yaml, notes.txt, results/, src/"
        in out.stderr
    ), out.stderr[-3000:]
    assert (
        every_path(folder) == paths and snapshot(folder) == before
    )  # no lock file, nothing moved aside
