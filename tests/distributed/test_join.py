"""Collectors of another launch join a running job (``topology.join_port``, ``python -m
harness.cli.join``) and leave it; the job learns from them meanwhile and goes on without them, its
trainer never restarted."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
from contextlib import ExitStack

import pytest
from helpers import compose_config, launch_env, launcher, rank_pid, rows, wait_for

from harness.testing import netns
from harness.testing.spawn import free_port


def joined_share(run_dir) -> list[float]:
    """Each row's share of frames from joined collectors (0 where none came)."""
    if not (run_dir / "metrics.csv").exists():
        return []
    shares = [float(r["collect/joined_fraction"] or "nan") for r in rows(run_dir)]
    return [0.0 if math.isnan(s) else s for s in shares]


@pytest.fixture(params=["one machine", "two nodes"])
def nodes(request):
    """Where the job and the joining launch run: (job's node, other node), each None for this
    machine's own network, or two network-namespace nodes joined by a veth (skipped, saying why,
    where they cannot be made)."""
    if request.param == "one machine":
        yield None, None
        return
    stack = ExitStack()
    try:
        pair = stack.enter_context(netns.two_nodes("j"))
    except netns.NamespaceError as e:
        pytest.skip(f"two simulated nodes need network namespaces: {e}")
    with stack:
        yield pair


@pytest.mark.e2e
def test_collectors_of_another_launch_join_a_running_job_and_leave_it(workdir, nodes):
    head, other = nodes
    port = free_port()
    args = [
        "debug=tiny",
        "collector.mode=async",
        f"topology.join_port={port}",
        "collector.total_frames=1000000000",  # the test stops it
        "logger.log_every_frames=1024",
        "logger.console=false",
        f"run_dir={workdir / 'run'}",
    ]
    launch = [*launcher(3), "-m", "harness.train", *args]
    job = subprocess.Popen(
        head.run(launch) if head else launch,
        cwd=workdir,
        env=launch_env(head.env() if head else {}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: len(joined_share(workdir / "run")) >= 2, 120, "the job's first rows")
        trainer = rank_pid(job, 0)
        join = [
            sys.executable,
            "-m",
            "harness.cli.join",
            f"{head.address if head else '127.0.0.1'}:{port}",
        ]
        logs = [workdir / f"joiner-{i}.txt" for i in range(2)]
        joiners = [
            subprocess.Popen(
                other.run(join) if other else join,
                cwd=workdir,
                env=launch_env(other.env() if other else {}),
                stdout=log.open("w"),
                stderr=subprocess.STDOUT,
            )
            for log in logs
        ]
        wait_for(
            lambda: all("joined the job at" in log.read_text() for log in logs),
            120,
            "both collectors to join",
        )
        wait_for(
            lambda: max(joined_share(workdir / "run")) > 0,
            120,
            "rows with frames from the joined collectors",
        )
        for joiner in joiners:
            joiner.send_signal(signal.SIGTERM)  # leave
        codes = [joiner.wait(timeout=120) for joiner in joiners]
        said = [log.read_text() for log in logs]
        assert codes == [0, 0], said
        assert all("left the job" in s for s in said), said
        left_at = len(joined_share(workdir / "run"))
        # Rows that begin once every joined collector left hold none of their frames.
        wait_for(
            lambda: len(joined_share(workdir / "run")) >= left_at + 3,
            120,
            "rows after the joined collectors left",
        )
        assert joined_share(workdir / "run")[left_at + 1 :] == [0.0] * len(
            joined_share(workdir / "run")[left_at + 1 :]
        )
        assert (
            job.poll() is None and rank_pid(job, 0) == trainer
        )  # the trainer went on, never restarted
    finally:
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=120)


@pytest.mark.unit
@pytest.mark.parametrize(
    "overrides, why",
    [
        (
            ["collector.mode=sync"],
            "collector.mode=sync: a round takes one batch from each of the job's collectors",
        ),
        (
            ["collector.mode=async", "topology.trainers=2"],
            "several trainers learn from equal shares of the frames",
        ),
        (["topology.join_port=70000"], "a TCP port is 1-65535"),
    ],
)
def test_a_job_that_collectors_cannot_join_is_refused_saying_why(overrides, why):
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace(")", r"\)")):
        compose_config("topology.join_port=29500", *overrides)
