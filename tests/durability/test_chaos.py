"""A short chaos run (benchmarks/chaos.py, issue 54): one real job with a schedule of seven of the
fault kinds the runner injects, and the run's invariants asserted from its report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ROOT, launch_env

# One of each, trainer_kill's restart of the whole job included. Left to the 20-minute runs
# (docs/runs_that_last.md): collector_rank_kill (a second such restart) and disk_full (needs root).
KINDS = [
    "worker_kill", "worker_hang", "env_raise", "env_nan", "trainer_kill", "refused_launch",
    "joiner_kill",
]  # fmt: skip


@pytest.mark.e2e
def test_a_short_chaos_schedule_is_survived_noticed_and_leaves_nothing_behind(workdir):
    report_path = workdir / "chaos.json"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "chaos.py"),
        "--seed=1",
        "--duration=56",
        "--every=8",  # seven faults
        "--by-frames",  # each at its share of the frames: a loaded machine slows both alike
        "--kinds",
        *KINDS,
        "--frames=100000",
        f"--json={report_path}",
        f"--log={workdir / 'chaos.log'}",
    ]
    out = subprocess.run(
        cmd, cwd=workdir, env=launch_env(), capture_output=True, text=True, timeout=600
    )
    assert report_path.exists(), out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(report_path.read_text())
    faults = [f for f in report["faults"] if "skipped" not in f]
    summary = out.stdout[-4000:]
    assert {f["kind"] for f in faults} == set(KINDS), summary
    assert report["exit_status"] == 0, summary
    assert report["frames_trained"] >= report["frames_asked"], summary
    assert report["duplicated"] == [] and report["missing_after"] == [], summary
    assert report["checkpoints"] and set(report["checkpoints"].values()) == {"ok"}, summary
    assert report["refused_launch_changed"] == [], summary
    assert report["not_noticed"] == [] and report["not_whole"] == [], summary
    assert report["shm_left"] == [] and report["processes_left"] == [], summary
    assert out.returncode == 0, summary
