"""A replay of single frames (``algo.replay_frames``) gives back the stacks a naive replay holds,
byte for byte, from real Atari batches, while it stores about one frame per transition."""

from __future__ import annotations

import pytest
import torch
from helpers import compose_config
from tensordict import TensorDict

from harness.algos import ALGOS
from harness.algos.frame_replay import FrameReplay
from harness.algos.transfer import HostToDevice
from harness.collect.envs import make_vec_env, spec_of
from harness.collect.rollout import RolloutCollector
from harness.sync import Header

pytestmark = pytest.mark.unit
KEYS = ("obs", "action", "reward", "next_obs", "terminated")


def atari_batches(count: int, envs: int = 2, frames: int = 128) -> list[TensorDict]:
    """``count`` batches of Breakout, as the harness preprocesses it, acted by DQN's random-start
    policy."""
    vec = make_vec_env("harness/Atari-Breakout-v5", envs)
    cfg = compose_config("algo=dqn", "env=breakout")
    policy = ALGOS["dqn"].make_policy(cfg.algo, spec_of(vec))
    collector = RolloutCollector(vec, policy, frames, seed=3, next_obs=True)
    header = Header(version=0, values={"random": 1.0})  # random acting, as before learning starts
    batches = [collector.collect(header)["rollout"].select(*KEYS).clone() for _ in range(count)]
    vec.close()
    return batches


def by_column(rollout: TensorDict) -> TensorDict:
    """A batch's transitions as the frame replay appends them: one env's steps after another's."""
    return rollout.permute(1, 0).reshape(-1)


def live(replay: FrameReplay) -> TensorDict:
    return replay.gather((replay.tail + torch.arange(replay.size)) % replay.capacity)


def test_the_stacks_come_back_byte_for_byte_with_about_one_frame_stored_per_transition():
    batches = atari_batches(3)
    replay = FrameReplay(1_000, batches[0])
    for batch in batches:
        replay.extend(batch)
    naive = torch.cat([by_column(b) for b in batches])
    got = live(replay)
    assert replay.size == naive.shape[0] == 384
    for key in KEYS:
        assert torch.equal(got[key], naive[key]), key
    assert replay.written / replay.size < 1.2  # about one 84x84 frame per transition, not eight
    sample = replay.take(torch.tensor([5, 200]), HostToDevice("cpu"))
    assert torch.equal(sample["next_obs"], naive["next_obs"][[5, 200]])


def test_when_the_rings_wrap_the_newest_transitions_stay_whole():
    batches = atari_batches(5)
    replay = FrameReplay(
        150, batches[0]
    )  # 5 x 256 transitions through 150 slots, and frames for about as many
    for batch in batches:
        replay.extend(batch)
    naive = torch.cat([by_column(b) for b in batches])[-replay.size :]
    assert 0 < replay.size <= 150
    got = live(replay)
    for key in KEYS:
        assert torch.equal(got[key], naive[key]), key


def test_stacks_that_share_nothing_are_stored_whole_and_still_come_back():
    rollout = TensorDict(
        obs=torch.randint(0, 255, (16, 2, 4, 6, 6), dtype=torch.uint8),
        next_obs=torch.randint(0, 255, (16, 2, 4, 6, 6), dtype=torch.uint8),
        action=torch.zeros(16, 2, dtype=torch.int64),
        reward=torch.randn(16, 2),
        terminated=torch.zeros(16, 2, dtype=torch.bool),
        batch_size=[16, 2],
    )
    replay = FrameReplay(256, rollout)
    replay.extend(rollout)
    got, naive = live(replay), by_column(rollout)
    assert replay.size == 32
    assert torch.equal(got["obs"], naive["obs"]) and torch.equal(got["next_obs"], naive["next_obs"])
    assert replay.written == 32 * 8


def test_a_checkpointed_frame_replay_resumes_as_it_was():
    batches = atari_batches(2, frames=64)
    replay = FrameReplay(100, batches[0])
    for batch in batches:
        replay.extend(batch)
    again = FrameReplay.from_state(replay.state_dict(), 100)
    for key in KEYS:
        assert torch.equal(live(again)[key], live(replay)[key])
    with pytest.raises(ValueError, match="holds 100 transitions and this run's 50"):
        FrameReplay.from_state(replay.state_dict(), 50)


def test_frame_replay_is_refused_for_state_vectors():
    with pytest.raises(
        ValueError, match=r"algo\.replay_frames=true stores stacked image frames once"
    ):
        compose_config("algo=dqn", "algo.replay_frames=true")
