"""Vectorised gymnasium environments and the specs read from them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

MUJOCO_HINT = "pip install -e '.[mujoco]'  (or: .venv/bin/pip install 'gymnasium[mujoco]')"


@dataclass(frozen=True)
class EnvSpec:
    """What the networks need to know about an env: read from the env itself."""

    obs_shape: tuple[int, ...]
    discrete: bool
    action_shape: tuple[int, ...]  # () for discrete
    num_actions: int  # discrete: number of actions; continuous: action dims
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()

    @property
    def obs_dim(self) -> int:
        """Observations flattened, as the MLPs take them."""
        return math.prod(self.obs_shape)


def check_env_id(env_id: str) -> None:
    """Fail at start-up, with what to do, for an env that cannot be made."""
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as e:
        raise ValueError(f"env.id={env_id!r} is not a registered gymnasium env ({e}). Pick one of conf/env/*.yaml.") from e
    if "mujoco" in str(spec.entry_point):
        try:
            import mujoco  # noqa: F401  (only probing that the extra is installed)
        except ImportError as e:
            raise ValueError(f"env.id={env_id!r} needs MuJoCo, which is not installed. Install the extra: {MUJOCO_HINT}") from e


def make_vec_env(env_id: str, num_envs: int, max_episode_steps: int | None = None) -> gym.vector.SyncVectorEnv:
    """``num_envs`` copies stepped in one process (the caller resets and seeds).

    Same-step autoreset: when an episode ends, ``step`` already returns the
    next episode's first observation, so every stored frame is a real one.
    """
    check_env_id(env_id)
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, max_episode_steps=max_episode_steps) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    return envs


def spec_of(envs: gym.vector.VectorEnv) -> EnvSpec:
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"observations must be a Box space; got {obs_space}")
    if isinstance(act_space, gym.spaces.Discrete):
        return EnvSpec(tuple(obs_space.shape), True, (), int(act_space.n))
    if isinstance(act_space, gym.spaces.Box):
        return EnvSpec(
            tuple(obs_space.shape), False, tuple(act_space.shape), int(np.prod(act_space.shape)),
            tuple(float(x) for x in act_space.low.ravel()), tuple(float(x) for x in act_space.high.ravel()),
        )
    raise ValueError(f"action space {act_space} is not supported: use Discrete or Box")


def env_spec(env_id: str, max_episode_steps: int | None = None) -> EnvSpec:
    """The spec without keeping an env around (trainers never step envs)."""
    envs = make_vec_env(env_id, 1, max_episode_steps=max_episode_steps)
    try:
        return spec_of(envs)
    finally:
        envs.close()


def to_tensor(x: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(np.asarray(x))
    return t.float() if t.is_floating_point() else t
