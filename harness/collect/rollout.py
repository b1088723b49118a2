"""Stepping envs with the local policy into a preallocated, packed batch.

A batch is one message of the data channel:

- ``rollout`` ``[T, N]``: ``obs`` (as the env returned it, also when the
  algorithm normalises observations: the trainer does that), the policy's outputs (``action``, ...),
  ``reward``, ``terminated``, ``truncated``, ``done`` and the
  ``policy_version`` that chose each action;
- ``next_obs`` ``[N]``: the observation after the last step, to bootstrap from;
- ``stats``: episodes finished in this batch with the sum of their returns and
  lengths; evaluation episodes run since the last batch; envs that raised
  and were made again (:class:`harness.collect.envs.RestartingEnv`: their
  broken episode ends as a truncation and is not counted); ``preempt`` (1 when
  the collector got SIGTERM/SIGUSR1); ``last`` (1 on the collector's final
  message, which carries no frames).
"""

from __future__ import annotations

from typing import Callable

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from harness.algos.base import Policy
from harness.collect.envs import to_tensor
from harness.packing import pack
from harness.sync.contract import Header

STATS = ("episodes", "return_sum", "length_sum", "eval_episodes", "eval_return_sum", "env_restarts", "preempt", "last")


def batch_template(policy: Policy, obs_shape: tuple[int, ...], steps: int, num_envs: int, next_obs: bool = False) -> TensorDict:
    """A packed, zero-filled batch. Collectors and trainers both build it from
    the config (the policy's outputs on a dummy observation give the extra
    fields), so the layout is known on both ends before any frame exists.
    ``next_obs``: also store each frame's next observation (the true final
    one at an episode's end), as replay-based algorithms need."""
    obs = torch.zeros(num_envs, *obs_shape)
    with torch.no_grad():
        out = policy.act(obs)
    frame = out.clone().update(
        {
            "obs": obs,
            "reward": torch.zeros(num_envs),
            "terminated": torch.zeros(num_envs, dtype=torch.bool),
            "truncated": torch.zeros(num_envs, dtype=torch.bool),
            "done": torch.zeros(num_envs, dtype=torch.bool),
            "policy_version": torch.zeros(num_envs, dtype=torch.int64),
        }
    )
    if next_obs:
        frame["next_obs"] = obs.clone()
    stats = TensorDict({k: torch.zeros((), dtype=torch.float64) for k in STATS})
    batch = TensorDict(rollout=frame.expand(steps, num_envs).clone(), next_obs=obs.clone(), stats=stats)
    return pack(batch.zero_())


class RolloutCollector:
    """Steps ``envs`` with ``policy`` and fills one packed batch per call.

    The batch is reused: it is valid until the next ``collect``.
    """

    def __init__(self, envs: gym.vector.VectorEnv, policy: Policy, frames_per_batch: int, seed: int, next_obs: bool = False):
        self.envs, self.policy = envs, policy
        self.num_envs = envs.num_envs
        if frames_per_batch % self.num_envs:
            raise ValueError(f"collector.frames_per_batch={frames_per_batch} must be a multiple of collector.num_envs={self.num_envs}")
        self.steps = frames_per_batch // self.num_envs
        obs_space, act_space = envs.single_observation_space, envs.single_action_space
        assert obs_space.shape is not None  # a Box: spec_of refuses other observation spaces at start-up
        self.batch = batch_template(policy, obs_space.shape, self.steps, self.num_envs, next_obs)
        # Per-field tensors and numpy views of them, looked up once: the step
        # loop then only copies (numpy item assignment is the cheapest there is).
        self.fields = dict(self.batch["rollout"].items())
        self.arrays = {k: v.numpy() for k, v in self.fields.items()}
        env_fields = ("obs", "next_obs", "reward", "terminated", "truncated", "done", "policy_version")
        self.policy_fields = [k for k in self.fields if k not in env_fields]
        self.stats = {k: self.batch["stats", k] for k in STATS}
        self.clip = (act_space.low, act_space.high) if isinstance(act_space, gym.spaces.Box) else None
        self.reset(seed)

    def reset(self, seed: int) -> None:
        """Start fresh episodes in every env (a resumed run reseeds here)."""
        obs, _ = self.envs.reset(seed=seed)
        self.obs = to_tensor(obs)
        self.episode_return = np.zeros(self.num_envs)
        self.episode_length = np.zeros(self.num_envs, dtype=np.int64)

    @torch.no_grad()
    def collect(self, header: Header, refresh: Callable[[], Header] | None = None) -> TensorDict:
        """One batch acted with ``header``'s weights, or, with ``refresh``
        (async mode), with whatever newest weights it returns before each step."""
        f, a, stats = self.fields, self.arrays, self.stats
        for value in stats.values():
            value.zero_()
        for t in range(self.steps):
            if refresh is not None:
                header = refresh()
            out = self.policy.act(self.obs, header.values)
            env_action = out["action"].numpy()
            if self.clip is not None:
                env_action = np.clip(env_action, *self.clip)  # store the sample, step the env with a legal action
            obs, reward, terminated, truncated, info = self.envs.step(env_action)
            for key in self.policy_fields:
                f[key][t] = out[key]
            a["obs"][t] = self.obs.numpy()
            a["reward"][t] = reward
            a["terminated"][t] = terminated
            a["truncated"][t] = truncated
            a["policy_version"][t] = header.version
            done = terminated | truncated
            if "next_obs" in a:
                a["next_obs"][t] = obs
                for i in np.flatnonzero(done):  # same-step autoreset: obs is already the next episode's
                    a["next_obs"][t, i] = info["final_obs"][i]
            self.obs = to_tensor(obs)

            self.episode_return += reward
            self.episode_length += 1
            restarted = info.get("final_info", {}).get("env_restarted")  # the ended episode's info, under autoreset
            if restarted is not None and restarted.any():  # broken episodes: not counted as finished ones
                stats["env_restarts"].add_(int(restarted.sum()))
                done = done & ~restarted
                self.episode_return[restarted] = 0
                self.episode_length[restarted] = 0
            if done.any():
                stats["episodes"].add_(int(done.sum()))
                stats["return_sum"].add_(float(self.episode_return[done].sum()))
                stats["length_sum"].add_(float(self.episode_length[done].sum()))
                self.episode_return[done] = 0
                self.episode_length[done] = 0
        torch.logical_or(f["terminated"], f["truncated"], out=f["done"])
        self.batch["next_obs"].copy_(self.obs)
        return self.batch
