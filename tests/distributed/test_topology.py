"""Role layouts: who trains, who collects, and the errors for layouts that cannot work."""

from __future__ import annotations

import re

import pytest

from harness.distributed.setup import resolve_run_dir
from harness.distributed.topology import Layout, LayoutError

pytestmark = pytest.mark.unit


def env(rank, world, node=0):
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": str(node),
    }


def test_plain_python_is_one_rank_that_trains_and_collects():
    layout = Layout.from_env(1, env={})
    assert layout.single_process and layout.is_trainer and layout.role == "trainer+collector"


def test_one_trainer_two_collectors():
    roles = [Layout.from_env(1, env=env(r, 3)).role for r in range(3)]
    assert roles == ["trainer", "collector", "collector"]
    layout = Layout.from_env(1, env=env(0, 3))
    assert layout.collector_ranks == [1, 2] and layout.collectors_of(0) == [1, 2]


def test_collectors_are_spread_over_trainers():
    layout = Layout.from_env(2, env=env(0, 6))
    assert layout.collectors_of(0) == [2, 4] and layout.collectors_of(1) == [3, 5]


def test_node_rank_comes_from_torchrun():
    assert Layout.from_env(1, env=env(3, 4, node=1)).node_rank == 1


@pytest.mark.parametrize("trainers, world", [(3, 3), (4, 3)])
def test_no_collector_left_is_an_error_showing_layout_and_fix(trainers, world):
    with pytest.raises(LayoutError) as info:
        Layout.from_env(trainers, env=env(0, world))
    text = str(info.value)
    assert f"topology.trainers={trainers}" in text and f"world size {world}" in text
    assert "trainers:" in text and "collectors:" in text  # the layout asked for
    assert f"--nproc_per_node={trainers + 1}" in text  # and how to fix it


def test_two_trainers_in_one_process_is_an_error():
    with pytest.raises(LayoutError, match=re.escape("topology.trainers=1")):
        Layout.from_env(2, env={})


def test_zero_trainers_is_an_error():
    with pytest.raises(LayoutError, match="at least one rank must train"):
        Layout.from_env(0, env=env(0, 3))


def test_run_dir_override_and_job_ids(monkeypatch):
    layout = Layout.from_env(1, env={})
    assert str(resolve_run_dir("/x/y", "runs", None, "n", layout)) == "/x/y"
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert (
        str(resolve_run_dir(None, "runs", None, "n", layout)) == "runs/slurm42-n"
    )  # a requeue finds it again
