"""Evaluation: deterministic-policy episodes, one per env, with one seed rule.

Three callers share it: the first collector of an online run (every
``eval.every_frames``, results riding on its next batch), every collector of
an offline run (each new version, results sent to the trainer), and a
single-process run, which evaluates in the trainer's own process.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from harness.algos.base import Policy
from harness.collect.envs import make_vec_env, to_tensor
from harness.metrics.stats import EvalResult
from harness.sync.contract import Header

EVAL_SEED_OFFSET = 10_000_000


def eval_seed(seed: int, rank: int, episodes: int) -> int:
    """The first seed of rank ``rank``'s evaluation envs. Training envs take
    ``seed + rank * num_envs`` onwards, so evaluation never replays a training
    episode, and no two ranks evaluate on the same episodes."""
    return seed + EVAL_SEED_OFFSET + rank * episodes


@torch.no_grad()
def evaluate(policy: Policy, envs: gym.vector.VectorEnv, seed: int, values: dict[str, float]) -> list[float]:
    """Run one episode in each of ``envs`` (same-step autoreset) and return
    the episode returns. Bounded by the envs' time limits."""
    obs, _ = envs.reset(seed=seed)
    obs = to_tensor(obs)
    returns = np.zeros(envs.num_envs)
    finished = np.zeros(envs.num_envs, dtype=bool)
    space = envs.single_action_space
    low_high = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None
    while not finished.all():
        action = policy(obs, values, deterministic=True)["action"].numpy()
        if low_high is not None:
            action = np.clip(action, *low_high)
        next_obs, reward, terminated, truncated, _ = envs.step(action)
        returns += np.where(finished, 0.0, reward)
        finished |= terminated | truncated
        obs = to_tensor(next_obs)
    return returns.tolist()


class Evaluation:
    """``episodes`` envs of ``env_id`` and a policy whose weights someone else
    keeps current (a weight subscriber): each call evaluates them as they are."""

    def __init__(self, env_id: str, max_episode_steps: int | None, episodes: int, policy: Policy, seed: int):
        self.envs = make_vec_env(env_id, episodes, max_episode_steps)
        self.policy, self.seed = policy, seed

    def __call__(self, header: Header) -> EvalResult:
        returns = evaluate(self.policy, self.envs, self.seed, dict(header.values))
        return EvalResult(header.version, float(len(returns)), math.fsum(returns))

    def close(self) -> None:
        self.envs.close()


class PeriodicEvaluation:
    """An online run's evaluation: each time ``every`` more frames were learned
    from (by the frame count that travels with the weights); the result rides
    on the collector's next batch."""

    def __init__(self, evaluation: Evaluation, every: int):
        self.evaluation, self.every, self.next = evaluation, every, every

    def maybe_run(self, batch: TensorDict, header: Header) -> None:
        if header.frames < self.next:
            return
        result = self.evaluation(header)
        batch["stats", "eval_episodes"].fill_(result.episodes)
        batch["stats", "eval_return_sum"].fill_(result.return_sum)
        self.next = (header.frames // self.every + 1) * self.every

    def close(self) -> None:
        self.evaluation.close()
