"""``evaluate``'s forward distance: on MuJoCo's locomotion tasks, how far each evaluation episode
moved (its last ``x_position`` minus its first), held against gymnasium's own env played with the
same actions; ``harness evaluate`` prints it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from harness.collect.evaluate import evaluate, make_eval_envs


class Push(torch.nn.Module):
    """A deterministic policy: the same action on every step (all joints at ``torque``)."""

    def __init__(self, torque: float):
        super().__init__()
        self.torque = torque

    def act(self, obs: torch.Tensor, values, deterministic: bool = False) -> TensorDict:
        action = torch.full((obs.shape[0], 3), self.torque)
        return TensorDict(action=action, batch_size=[obs.shape[0]])


class Left(torch.nn.Module):
    """CartPole's action 0 on every step."""

    def act(self, obs: torch.Tensor, values, deterministic: bool = False) -> TensorDict:
        action = torch.zeros(obs.shape[0], dtype=torch.int64)
        return TensorDict(action=action, batch_size=[obs.shape[0]])


def reference_distance(seed: int, torque: float) -> float:
    """One Hopper-v5 episode played with gymnasium alone: the last x_position minus the first."""
    env = gym.make("Hopper-v5")
    _, info = env.reset(seed=seed)
    first, done = info["x_position"], False
    while not done:
        _, _, terminated, truncated, info = env.step(np.full(3, torque, dtype=np.float32))
        done = terminated or truncated
    env.close()
    return float(info["x_position"] - first)


@pytest.mark.unit
@pytest.mark.parametrize("torque", [0.0, 0.8])
def test_each_episodes_forward_distance_is_gymnasiums_own(torque, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MuJoCo writes MUJOCO_LOG.TXT where it runs
    envs = make_eval_envs("Hopper-v5", 3, None, render=False)
    distances: list[float] = []
    try:
        evaluate(Push(torque), envs, seed=11, values={}, distances=distances)  # type: ignore[arg-type]
    finally:
        envs.close()
    # the vector env seeds its envs 11, 12, 13
    assert distances == pytest.approx([reference_distance(s, torque) for s in (11, 12, 13)])
    assert max(abs(d) for d in distances) > 1e-3  # the episodes did move the hopper


@pytest.mark.unit
def test_envs_without_a_position_give_no_distance():
    envs = make_eval_envs("CartPole-v1", 2, None, render=False)
    distances: list[float] = []
    try:
        evaluate(Left(), envs, seed=0, values={}, distances=distances)  # type: ignore[arg-type]
    finally:
        envs.close()
    assert distances == []
