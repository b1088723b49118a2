"""Start-up across real ranks: bounded joins and one shared run directory."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import torch
from helpers import wait_for

from harness.algos.ppo import PPO, PPOConfig
from harness.collect.envs import env_spec
from harness.collect.rollout import batch_template
from harness.data.channel import BatchReceiver, BatchSender, ChannelError
from harness.distributed.setup import init_distributed, resolve_run_dir
from harness.distributed.topology import Layout
from harness.testing.spawn import run_ranks

pytestmark = pytest.mark.multiprocess


def join(rank, world, timeout_s):
    try:
        init_distributed(Layout.from_env(1), timeout_s)
    except RuntimeError as e:
        return str(e)
    return "joined"


def test_a_rank_that_never_joins_fails_start_up_within_the_timeout_naming_it():
    results = run_ranks(join, 4, 3.0, ranks=[0, 1], timeout=60)  # ranks 2 and 3 never start
    for rank in (0, 1):
        assert results[rank][0] == "ok", results[rank]  # not "hung": the join gave up by itself
        message = results[rank][1]
        assert f"rank {rank}" in message and "all 4 ranks" in message, message
    # Rank 0 hosts the store that holds the roll call (torchrun's agent would, for every rank).
    assert "ranks 2-3 never came" in results[0][1], results[0][1]


def shared_dir(rank, world):
    layout = Layout.from_env(1)
    init_distributed(layout, 20)
    if rank == 1:  # a clock that reads another second, were each rank's clock read
        time.strftime = lambda *args: "19700101-000000"
    return str(resolve_run_dir(None, "runs", None, "ppo-CartPole-v1-seed1", layout))


def test_every_rank_gets_the_same_run_dir(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("HARNESS_LAUNCH_STAMP", raising=False)
    results = run_ranks(shared_dir, 3)
    dirs = {value for _, value in results.values()}
    assert len(dirs) == 1, results  # rank 0's clock, told to the others (rank 1's reads 1970)
    assert re.fullmatch(r"runs/20\d{6}-\d{6}-ppo-CartPole-v1-seed1", next(iter(dirs))), results


def template():
    policy = PPO.make_policy(PPOConfig(), env_spec("CartPole-v1"))
    return batch_template(policy, (4,), steps=8, num_envs=2)


def channel(rank, world, rounds, die_rank, pid_file=None):
    """Collectors 1 and 2 send ``rounds`` batches to trainer 0; ``die_rank`` exits
    without sending. With ``pid_file`` the trainer waits until it has exited."""
    groups = init_distributed(Layout.from_env(1), 20)
    if rank == 0:
        receiver = BatchReceiver(groups.data, 0, [1, 2], template(), timeout_s=5)
        if pid_file is not None:
            wait_for(lambda: exited(pid_file), 60, "the dying collector's process to exit")
        got = []
        try:
            for _ in range(rounds):
                got.append([b["rollout", "obs"].clone() for b in receiver.receive()])
        except ChannelError as e:
            return "error", str(e)
        return "batches", [[t.tolist() for t in r] for r in got]
    sender = BatchSender(groups.data, rank, 0, template(), timeout_s=5)
    if rank == die_rank:
        if pid_file is not None:
            Path(pid_file).write_text(str(os.getpid()))
        return None  # exits without sending: the trainer must notice
    batch = template()
    for r in range(rounds):
        batch["rollout", "obs"].copy_(torch.full((8, 2, 4), 10.0 * rank + r))
        sender.send(batch)
    return None


def exited(pid_file: str) -> bool:
    """The process named in ``pid_file`` is gone or a zombie: its sockets are closed."""
    pid = Path(pid_file).read_text() if Path(pid_file).exists() else ""
    if not pid:  # not written yet
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_data_channel_delivers_each_collectors_batches_bit_exact():
    results = run_ranks(channel, 3, 3, None)
    kind, rounds = results[0][1]
    assert kind == "batches"
    for r, (from1, from2) in enumerate(rounds):
        assert torch.equal(torch.tensor(from1), torch.full((8, 2, 4), 10.0 + r))
        assert torch.equal(torch.tensor(from2), torch.full((8, 2, 4), 20.0 + r))


@pytest.mark.parametrize(
    "when", ["while the trainer waits", "before the trainer posts its receive"]
)
def test_dead_collector_is_named_by_the_trainer(tmp_path, when):
    # Gone first, gloo raises when the receive is posted or when it is waited on, as the close
    # reached it: CI met the first (a bare gloo error, before BatchReceiver named the collector
    # there too).
    pid_file = str(tmp_path / "pid") if when.startswith("before") else None
    results = run_ranks(channel, 3, 2, 2, pid_file, timeout=60)
    assert results[0][0] == "ok", results[0]
    kind, message = results[0][1]
    assert kind == "error" and "collector rank 2" in message, results[0]
