"""Several trainers in async mode: each learns from its own collectors' stream
into its own replay, gradients are averaged, and all keep in step."""

from __future__ import annotations

import hashlib
import os
import signal
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from helpers import column, compose_config, rows, wait_for
from tensordict import TensorDict

from harness.testing.spawn import run_ranks

pytestmark = pytest.mark.multiprocess

# DQN on CartPole, 2 trainers + 2 collectors: learning starts at 256 frames, a step per 4 frames
# (320 in 1536 frames), each trainer samples 16 of the 32 transitions per step; no frame may be
# older than the newest version.
ASYNC_DQN = [
    "debug=tiny",
    "algo=dqn",
    "collector.mode=async",
    "topology.trainers=2",
    "collector.total_frames=1536",
    "algo.learning_starts=256",
    "algo.batch_size=32",
    "algo.update_to_data=0.25",
    "collector.max_policy_lag=0",
    "logger.log_every_frames=128",
    "checkpoint.every_frames=512",
    "checkpoint.replay_buffer=true",
    "logger.console=false",
]


def digest(state: object) -> str:
    """A hash of every tensor and number in a nested state dict."""
    h = hashlib.sha256()

    def visit(value: object) -> None:
        if isinstance(value, torch.Tensor):
            h.update(
                value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            )
        elif isinstance(value, dict):
            for k in sorted(value, key=str):
                h.update(str(k).encode())
                visit(value[k])
        elif isinstance(value, (list, tuple)):
            for v in value:
                visit(v)
        else:
            h.update(repr(value).encode())

    visit(state)
    return h.hexdigest()


def job(rank, world, overrides, run_dir, preempt_after=None):
    """The harness's own trainer and collector loops in spawned ranks; each
    trainer reports a hash of its weights and optimisers, and of its replay
    buffer as resumed and as it ends. With ``preempt_after``, the last
    collector (trainer 1's) sends itself SIGUSR1 after that many batches."""
    from harness.distributed import signals
    from harness.distributed.setup import init_distributed
    from harness.distributed.topology import Layout
    from harness.roles.collector import run_collector
    from harness.roles.trainer import Trainer

    cfg = compose_config(*overrides)
    layout = Layout.from_env(cfg.topology.trainers)
    groups = init_distributed(layout, cfg.dist_timeout_s)
    signals.install()
    if not layout.is_trainer:
        if preempt_after is not None and rank == world - 1:
            from harness.data import channel

            send, sent = channel.BatchSender.send, []

            def send_then_preempt(self, batch, **kwargs):
                send(self, batch, **kwargs)
                sent.append(1)
                if len(sent) == preempt_after:
                    os.kill(os.getpid(), signal.SIGUSR1)

            channel.BatchSender.send = send_then_preempt
        return run_collector(cfg, layout, groups)
    trainer = Trainer(cfg, layout, groups, Path(run_dir))
    replay_state = getattr(trainer.algo, "replay_state", lambda: None)  # on-policy PPO keeps none
    resumed = replay_state()
    trainer.run(trainer.kind.loop(layout))
    return {
        "weights": digest(trainer.algo.state_dict()),
        "replay": digest(replay_state()),
        "resumed_replay": None if resumed is None else digest(resumed),
        "frames": trainer.progress.frames,
        "gradient_steps": trainer.algo.gradient_steps,
        "preempted": trainer.preempted,
    }


def test_two_async_trainers_stop_together_hold_the_same_weights_keep_lag_bounded_and_resume(
    tmp_path,
):
    run, steps = (
        tmp_path / "run",
        lambda: sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*")),
    )
    first = run_ranks(
        job, 4, ASYNC_DQN, str(run), 6, timeout=300
    )  # trainer 1's collector is preempted
    assert all(status == "ok" for status, _ in first.values()), first
    a, b = first[0][1], first[1][1]
    assert a["preempted"] and b["preempted"] and a["frames"] == b["frames"] < 1536, (
        a,
        b,
    )  # both stopped after one update
    assert steps()[-1] == f"step-{a['frames']:012d}"  # and checkpointed it
    assert a["weights"] == b["weights"]  # models and optimisers, bit for bit
    assert a["replay"] != b["replay"]  # each learned from its own collector

    second = run_ranks(job, 4, ASYNC_DQN, str(run), timeout=300)
    assert all(status == "ok" for status, _ in second.values()), second
    assert [second[r][1]["resumed_replay"] for r in (0, 1)] == [
        a["replay"],
        b["replay"],
    ]  # each its own replay back
    assert second[0][1]["weights"] == second[1][1]["weights"] and second[0][1]["frames"] == 1536
    table = rows(run)
    assert [int(r["frames"]) for r in table] == list(
        range(128, 1537, 128)
    )  # every frame range logged once
    assert (
        int(table[-1]["train/gradient_steps"]) == 320
        and int(table[-1]["train/replay_size"]) == 1536
    )
    assert (
        min(column(table, "collect/policy_lag_min")) >= 0
        and max(column(table, "collect/policy_lag_max")) <= 0
    )
    assert (
        sum(column(table, "collect/batches_dropped")) > 0
    )  # the bound bit: batches that span a publish


# PPO with V-trace on CartPole, 2 trainers + 2 collectors; a KL bound so small that the epochs stop
# early, on the trainers' mean KL (each trainer's own differs: stopping on it, they would take
# different numbers of steps).
ASYNC_PPO = [
    "debug=tiny",
    "collector.mode=async",
    "topology.trainers=2",
    "collector.total_frames=2048",
    "algo.target_kl=1e-4",
    "logger.log_every_frames=256",
    "checkpoint.every_frames=0",
    "logger.console=false",
]


def test_two_async_ppo_trainers_learn_with_vtrace_in_step(tmp_path):
    results = run_ranks(job, 4, ASYNC_PPO, str(tmp_path), timeout=300)
    assert all(status == "ok" for status, _ in results.values()), results
    a, b = results[0][1], results[1][1]
    assert a["weights"] == b["weights"] and a["frames"] == b["frames"] == 2048, (a, b)
    table = rows(tmp_path)
    assert [int(r["frames"]) for r in table] == list(range(256, 2049, 256))
    assert max(column(table, "collect/policy_lag_max")) <= 4  # collector.max_policy_lag
    clipped = column(table, "train/vtrace_rho_clipped")
    assert (
        all(0 <= c <= 1 for c in clipped) and max(clipped) > 0
    )  # V-trace ran, on frames from older versions
    updates = int(table[-1]["train/updates"])
    assert updates == 2048 // 128  # an update: one batch of 64 frames on each trainer
    # The KL bound bit (10 epochs an update without it), and both trainers stopped alike.
    assert a["gradient_steps"] == b["gradient_steps"] < updates * 10, (a, b)


def late_trainer(rank, world, late, marker):
    """Two trainers meet; ``late`` never comes (it waits until the other gave up)."""
    import torch.distributed as dist

    from harness.distributed.trainers import meet

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=5))
    group = dist.new_group([0, 1], backend="gloo", timeout=timedelta(seconds=5))
    if rank == late:
        wait_for(Path(marker).exists, 60, "the other trainer to give up")
        return "late"
    try:
        meet(group, 5, "for update 7")
    except RuntimeError as e:
        return str(e)
    finally:
        Path(marker).touch()
    return "met"


@pytest.mark.parametrize("late", [1, 0])
def test_a_trainer_that_does_not_come_is_named_by_the_other(tmp_path, late):
    results = run_ranks(late_trainer, 2, late, str(tmp_path / "gave-up"), timeout=120)
    message = results[1 - late][1]
    assert (
        f"trainer rank(s) [{late}] did not come within 5 s" in message and "for update 7" in message
    ), results


def resumed_replay(rank, world):
    """Two trainers' SAC: each fills its own replay (capacity buffer_size / 2), then a resumed one
    takes it back."""
    import torch.distributed as dist

    from harness.algos import ALGOS
    from harness.collect.envs import env_spec

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    try:
        sac, spec = ALGOS["sac"], env_spec("Pendulum-v1")
        cfg = sac.Config(
            buffer_size=64, batch_size=8, learning_starts=10_000
        )  # no gradient step: only the replay

        def batch(n: int) -> TensorDict:
            frames = TensorDict(
                obs=torch.ones(n, 3),
                action=torch.ones(n, 1),
                reward=torch.ones(n),
                next_obs=torch.ones(n, 3),
                terminated=torch.zeros(n, dtype=torch.bool),
                batch_size=[n],
            )
            return TensorDict(rollout=frames.unsqueeze(1), batch_size=[])

        algo = sac(cfg, spec, 1000, dist.group.WORLD)
        algo.update([batch(48)], 0)  # more than its 32: full, the cursor mid-way
        again = sac(cfg, spec, 1000, dist.group.WORLD)
        again.load_replay_state(algo.replay_state())
        again.update([batch(8)], 96)
        buffer = again.buffer
        return {
            "capacity": (algo.buffer.capacity, buffer.capacity),
            "size": buffer.size,
            "every_slot_written": bool((buffer.storage["obs"][: buffer.size] == 1).all()),
        }
    finally:
        dist.destroy_process_group()


def test_each_trainer_resumes_its_replay_at_its_own_capacity():
    results = run_ranks(resumed_replay, 2, timeout=120)
    assert all(status == "ok" for status, _ in results.values()), results
    for _, value in results.values():
        assert value == {"capacity": (32, 32), "size": 32, "every_slot_written": True}, value
