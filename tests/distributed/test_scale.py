"""The job grown: two nodes that talk over network interfaces of their own,
and one trainer with 31 collectors, each through the real torchrun."""

from __future__ import annotations

import subprocess
from contextlib import ExitStack
from pathlib import Path

import pytest
from helpers import launch_env, rows, run_harness

from harness.sync.shm_files import PREFIX
from harness.testing import netns

pytestmark = pytest.mark.e2e


def segments() -> set[Path]:
    return set(Path("/dev/shm").glob(f"{PREFIX}*"))


@pytest.fixture(scope="module")
def two_nodes():
    """Two network namespaces joined by a veth pair, removed after the tests
    whatever their outcome; skips, saying why, where they cannot be made."""
    stack = ExitStack()
    try:
        nodes = stack.enter_context(netns.two_nodes())
    except netns.NamespaceError as e:
        pytest.skip(f"two simulated nodes need network namespaces: {e}")
    with stack:
        yield nodes


@pytest.mark.parametrize("scheme", ["gloo", "hierarchical"])
def test_two_nodes_train_over_their_own_interfaces(workdir, two_nodes, scheme):
    """One torchrun per namespace, meeting at a c10d rendezvous on the first
    node's address; Gloo binds to the veth, the only way between the two.
    2 ranks a node: 1 trainer + 3 collectors, and with sync=hierarchical the
    second node's leader forwards to the other collector through its own
    node's segment, which shares /dev/shm (one kernel) with the first's."""
    before, carried = segments(), sum(node.bytes_received() for node in two_nodes)
    args = [
        "-m",
        "harness.train",
        "debug=tiny",
        f"sync={scheme}",
        f"run_dir={workdir / 'run'}",
        "logger.console=false",
    ]
    launches = [
        subprocess.Popen(
            node.torchrun(i, two_nodes[0], 2, args, run_id=f"two-nodes-{scheme}"),
            cwd=workdir,
            env=launch_env(node.env()),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, node in enumerate(two_nodes)
    ]
    try:
        outs = [p.communicate(timeout=300) for p in launches]
    finally:
        for p in launches:
            p.kill()  # only still running if communicate timed out
    assert [p.returncode for p in launches] == [0, 0], [o[1][-3000:] for o in outs]
    table = rows(workdir / "run")
    assert int(table[-1]["frames"]) == 1152  # 3 collectors x 64 frames a round, 6 rounds
    # Every round's weights crossed to the other node, and so did its collectors' batches.
    carried = sum(node.bytes_received() for node in two_nodes) - carried
    assert carried > 6 * float(table[-1]["sync/bytes"]), carried
    assert segments() - before == set()  # each node's segment removed at the end


def test_one_trainer_and_31_collectors_start_run_and_stop(workdir):
    """32 ranks on 2 cores with the scheme that keeps the most per-rank state
    (a segment of 33 slots, a lock and a reader per collector); gloo and
    hierarchical at 32 ranks are measured by benchmarks/scale.py (a launch
    of 32 ranks takes a minute or two here: docs/scaling.md)."""
    before = segments()
    out = run_harness(
        [
            "debug=tiny",
            "sync=shm",
            "collector.total_frames=3968",
            "run_dir=run",
            "logger.console=false",
        ],
        workdir,
        nproc=32,
        timeout=560,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    table = rows(workdir / "run")
    assert int(table[-1]["frames"]) == 3968  # 2 rounds of 31 collectors x 64 frames
    assert (
        float(table[-1]["collect/policy_lag_max"]) == 0
    )  # round 2 acted with the weights published after round 1
    assert segments() - before == set()
