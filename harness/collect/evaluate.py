"""Evaluation episodes: the deterministic policy, one episode per env."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from harness.algos.base import Policy
from harness.collect.envs import to_tensor


@torch.no_grad()
def evaluate(policy: Policy, envs: gym.vector.VectorEnv, seed: int, values: dict[str, float]) -> list[float]:
    """Run one episode in each of ``envs`` (same-step autoreset) and return
    the episode returns. Bounded by the envs' time limits."""
    obs, _ = envs.reset(seed=seed)
    obs = to_tensor(obs)
    returns = np.zeros(envs.num_envs)
    finished = np.zeros(envs.num_envs, dtype=bool)
    low_high = (envs.single_action_space.low, envs.single_action_space.high) if isinstance(envs.single_action_space, gym.spaces.Box) else None
    while not finished.all():
        action = policy(obs, values, deterministic=True)["action"].numpy()
        if low_high is not None:
            action = np.clip(action, *low_high)
        next_obs, reward, terminated, truncated, _ = envs.step(action)
        returns += np.where(finished, 0.0, reward)
        finished |= terminated | truncated
        obs = to_tensor(next_obs)
    return returns.tolist()
