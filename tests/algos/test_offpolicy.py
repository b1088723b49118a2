"""Replay buffer and the off-policy losses on hand-checked tiny cases."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from harness.algos.dqn import DQN, DQNConfig, epsilon_at
from harness.algos.replay import ReplayBuffer
from harness.algos.sac import SAC, SACConfig
from harness.algos.td3 import TD3, TD3Config
from harness.collect.envs import env_spec

PENDULUM, CARTPOLE = env_spec("Pendulum-v1"), env_spec("CartPole-v1")


def transitions(n: int, start: int = 0) -> TensorDict:
    ids = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict(obs=ids[:, None].expand(n, 3).clone(), reward=ids, batch_size=[n])


@pytest.mark.unit
def test_replay_wraps_around_keeping_the_newest():
    buffer = ReplayBuffer(5, transitions(1)[0])
    buffer.extend(transitions(3))
    buffer.extend(transitions(4, start=3))  # 7 in all: 0 and 1 are overwritten
    assert buffer.size == 5 and buffer.cursor == 2
    assert buffer.storage["reward"].tolist() == [5, 6, 2, 3, 4]  # a ring: 5 and 6 wrapped
    assert buffer.storage["obs"][:, 0].tolist() == [5, 6, 2, 3, 4]
    assert buffer.nbytes == 5 * (3 + 1) * 4


@pytest.mark.unit
def test_replay_samples_only_what_was_stored():
    buffer = ReplayBuffer(100, transitions(1)[0])
    buffer.extend(transitions(10))
    sample = buffer.sample(1000, torch.Generator().manual_seed(0))
    assert sample.shape == (1000,) and sample["reward"].min() >= 0 and sample["reward"].max() <= 9
    assert len(sample["reward"].unique()) == 10  # every stored transition can come out
    with pytest.raises(RuntimeError, match="empty"):
        ReplayBuffer(3, transitions(1)[0]).sample(1)


@pytest.mark.unit
def test_replay_on_disk_is_memory_mapped(tmp_path):
    buffer = ReplayBuffer(8, transitions(1)[0], memmap_dir=tmp_path / "replay")
    buffer.extend(transitions(3))
    assert buffer.storage.is_memmap() and (tmp_path / "replay").exists()
    assert buffer.sample(4)["reward"].max() <= 2


def batch(n=2, discrete=False):
    g = torch.Generator().manual_seed(0)
    obs_dim = 4 if discrete else 3
    return TensorDict(
        obs=torch.randn(n, obs_dim, generator=g),
        next_obs=torch.randn(n, obs_dim, generator=g),
        reward=torch.tensor([1.0, 2.0]),
        terminated=torch.tensor([False, True]),
        action=torch.zeros(n, dtype=torch.int64) if discrete else torch.zeros(n, 1),
        batch_size=[n],
    )


@pytest.mark.unit
def test_sac_target_is_min_q_minus_alpha_logp_and_stops_at_termination():
    sac = SAC(SACConfig(autotune=False, alpha=0.5, gamma=0.9), PENDULUM, 1000)
    sac.critics.targets = lambda obs, action: torch.tensor([[3.0], [5.0]]).expand(
        2, obs.shape[0]
    )  # Q'_1 = 3, Q'_2 = 5
    sac.policy.sample = lambda obs: (
        torch.zeros(obs.shape[0], 1),
        torch.full((obs.shape[0],), -2.0),
        None,
    )
    target = sac.q_target(batch())
    # not terminated: 1 + 0.9 * (min(3, 5) - 0.5 * -2) = 4.6; terminated: just the reward
    assert torch.allclose(target, torch.tensor([1 + 0.9 * (3 + 1.0), 2.0]))


@pytest.mark.unit
def test_sac_entropy_tuning_raises_alpha_when_entropy_is_too_low():
    sac = SAC(SACConfig(), PENDULUM, 1000)
    assert sac.target_entropy == -1.0
    # log pi = +3 means entropy -3, below the target -1: alpha must grow.
    sac.policy.sample = lambda obs: (
        torch.zeros(obs.shape[0], 1, requires_grad=True),
        torch.full((obs.shape[0],), 3.0),
        None,
    )
    before = sac.log_alpha.log_value.item()
    sac.gradient_steps = 0
    sac.learn(batch())
    assert sac.log_alpha.log_value.item() > before


@pytest.mark.unit
def test_td3_updates_the_actor_only_every_policy_frequency_steps():
    td3 = TD3(TD3Config(policy_frequency=3), PENDULUM, 1000)
    data = batch()
    changes = []
    for step in range(1, 7):
        td3.gradient_steps = step
        before = [p.clone() for p in td3.policy.parameters()]
        td3.learn(data)
        changes.append(any(not torch.equal(a, b) for a, b in zip(before, td3.policy.parameters())))
    assert changes == [False, False, True, False, False, True]


@pytest.mark.unit
def test_td3_target_action_stays_in_the_box():
    td3 = TD3(TD3Config(policy_noise=100.0, noise_clip=100.0), PENDULUM, 1000)
    seen = []
    original = td3.critics.targets
    td3.critics.targets = lambda obs, action: (seen.append(action.clone()), original(obs, action))[
        1
    ]
    td3.q_target(batch())
    assert seen and seen[0].abs().max() <= 2.0  # Pendulum's torque limit


@pytest.mark.unit
def test_double_dqn_chooses_with_the_online_network_and_values_with_the_target():
    dqn = DQN(DQNConfig(double_dqn=True, gamma=1.0), CARTPOLE, 1000)
    dqn.policy.q = lambda obs: torch.tensor([[0.0, 9.0]] * obs.shape[0])  # online prefers action 1
    dqn.target.q = lambda obs: torch.tensor([[7.0, 1.0]] * obs.shape[0])  # target would pick 0
    assert torch.allclose(dqn.td_target(batch(discrete=True)), torch.tensor([1.0 + 1.0, 2.0]))
    dqn.cfg.double_dqn = False
    assert torch.allclose(dqn.td_target(batch(discrete=True)), torch.tensor([1.0 + 7.0, 2.0]))


@pytest.mark.unit
def test_epsilon_decays_linearly_with_the_global_frame_count():
    cfg = DQNConfig(start_e=1.0, end_e=0.05, exploration_fraction=0.5)
    assert epsilon_at(cfg, 0, 1000) == 1.0
    assert math.isclose(epsilon_at(cfg, 250, 1000), 0.525)
    assert epsilon_at(cfg, 900, 1000) == 0.05
    dqn = DQN(cfg, CARTPOLE, 1000)
    assert dqn.values_for_header(250) == {"random": 1.0, "epsilon": pytest.approx(0.525)}


@pytest.mark.unit
def test_update_to_data_is_held_per_frame():
    dqn = DQN(DQNConfig(learning_starts=0, update_to_data=0.25, batch_size=4), CARTPOLE, 10_000)
    rollout = TensorDict(
        obs=torch.zeros(8, 2, 4),
        next_obs=torch.zeros(8, 2, 4),
        reward=torch.zeros(8, 2),
        action=torch.zeros(8, 2, dtype=torch.int64),
        terminated=torch.zeros(8, 2, dtype=torch.bool),
        batch_size=[8, 2],
    )
    metrics = dqn.update([TensorDict(rollout=rollout)], frames=0)
    assert metrics["train/gradient_steps"] == 4 and metrics["train/replay_size"] == 16
