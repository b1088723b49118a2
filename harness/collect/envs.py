"""Vectorised gymnasium environments and the specs read from them."""

from __future__ import annotations

import importlib
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, SupportsFloat

import gymnasium as gym
import numpy as np
import torch

log = logging.getLogger("harness")
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
    """Fail at start-up, with what to do, for an env that cannot be made.
    ``module:Env-v0`` imports ``module`` first (it registers the env), as ``gym.make`` does."""
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ValueError(f"env.id={env_id!r}: cannot import {module!r}, which should register {name!r} ({e})") from e
    try:
        spec = gym.spec(name)
    except gym.error.Error as e:
        raise ValueError(f"env.id={env_id!r} is not a registered gymnasium env ({e}). Pick one of conf/env/*.yaml.") from e
    if "mujoco" in str(spec.entry_point):
        try:
            import mujoco  # noqa: F401  (only probing that the extra is installed)
        except ImportError as e:
            raise ValueError(f"env.id={env_id!r} needs MuJoCo, which is not installed. Install the extra: {MUJOCO_HINT}") from e


class RestartingEnv(gym.Wrapper):
    """An env that is made again when it raises, up to ``max_restarts`` times.

    A step that raises ends the episode there: it returns the last good
    observation, reward 0 and ``truncated``, with ``info["env_restarted"]``,
    and the vector env's autoreset then resets a new copy, seeded anew. The
    broken episode's return is not counted (the collector drops it). Past
    ``max_restarts`` the error names the env, its seed and the cause.
    """

    def __init__(self, make: Callable[[], gym.Env], env_id: str, max_restarts: int):
        super().__init__(make())
        self.make, self.env_id, self.max_restarts = make, env_id, max_restarts
        self.restarts = 0
        self.seed: int | None = None
        self.last_obs: Any = None
        self.broken = False

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        if seed is not None:
            self.seed = seed
        if self.broken:
            self.env.close()
            self.env, self.broken = self.make(), False
            # A new seed: the old one would replay the episode that broke.
            seed = None if self.seed is None else self.seed + 1_000_003 * self.restarts
        self.last_obs, info = self.env.reset(seed=seed, options=options)
        return self.last_obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        try:
            obs, reward, terminated, truncated, info = self.env.step(action)
        except Exception as e:  # any failure of the env's own code
            self.restarts += 1
            if self.restarts > self.max_restarts:
                raise RuntimeError(
                    f"env {self.env_id} (seed {self.seed}) raised {self.restarts} times, more than "
                    f"collector.max_env_restarts={self.max_restarts}: {type(e).__name__}: {e}"
                ) from e
            log.warning(
                "env %s (seed %s) raised %s: %s; making it again (restart %d of at most %d)",
                self.env_id,
                self.seed,
                type(e).__name__,
                e,
                self.restarts,
                self.max_restarts,
            )
            self.broken = True
            return self.last_obs, 0.0, False, True, {"env_restarted": True}
        self.last_obs = obs
        return obs, reward, terminated, truncated, info


def make_vec_env(
    env_id: str, num_envs: int, max_episode_steps: int | None = None, max_restarts: int = 0
) -> gym.vector.SyncVectorEnv:
    """``num_envs`` copies stepped in one process (the caller resets and seeds).

    Same-step autoreset: when an episode ends, ``step`` already returns the
    next episode's first observation, so every stored frame is a real one.
    ``max_restarts``: each copy is made again this many times when it raises
    (:class:`RestartingEnv`); 0 lets the first error end the process.
    """
    check_env_id(env_id)

    def make_one() -> gym.Env:
        return gym.make(env_id, max_episode_steps=max_episode_steps)

    def make() -> gym.Env:
        return RestartingEnv(make_one, env_id, max_restarts) if max_restarts else make_one()

    return gym.vector.SyncVectorEnv([make for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def spec_of(envs: gym.vector.VectorEnv) -> EnvSpec:
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"observations must be a Box space; got {obs_space}")
    if isinstance(act_space, gym.spaces.Discrete):
        return EnvSpec(tuple(obs_space.shape), True, (), int(act_space.n))
    if isinstance(act_space, gym.spaces.Box):
        return EnvSpec(
            tuple(obs_space.shape),
            False,
            tuple(act_space.shape),
            int(np.prod(act_space.shape)),
            tuple(float(x) for x in act_space.low.ravel()),
            tuple(float(x) for x in act_space.high.ravel()),
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
