"""Vectorised gymnasium environments and the specs read from them."""

from __future__ import annotations

import importlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
import torch

from harness.collect import pixels, popgym_envs
from harness.collect.watchdog import StepWatchdog, watchdog
from harness.core.specs import EnvSpec

log = logging.getLogger("harness")
MUJOCO_HINT = "pip install -e '.[mujoco]'  (or: .venv/bin/pip install 'gymnasium[mujoco]')"
# Part of an env's entry point -> (the module it needs, what that is, how to install it), probed
# before any env is made.
EXTRAS = {
    "mujoco": ("mujoco", "MuJoCo", MUJOCO_HINT),
    "make_minatar": ("minatar", "MinAtar", pixels.MINATAR_HINT),
    "make_atari": ("ale_py", "ale-py", pixels.ATARI_HINT),
    "make_popgym": ("popgym", "POPGym", popgym_envs.POPGYM_HINT),
}
pixels.register()
popgym_envs.register()


def check_env_id(env_id: str) -> None:
    """Fail at start-up, with what to do, for an env that cannot be made.
    ``module:Env-v0`` imports ``module`` first (it registers the env), as ``gym.make`` does."""
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ValueError(
                f"env.id={env_id!r}: cannot import {module!r}, which should register {name!r} ({e})"
            ) from e
    try:
        spec = gym.spec(name)
    except gym.error.Error as e:
        raise ValueError(
            f"env.id={env_id!r} is not a registered gymnasium env ({e}). Pick "
            "one of conf/env/*.yaml."
        ) from e
    for entry_point, (module, what, hint) in EXTRAS.items():
        if entry_point in str(spec.entry_point):
            try:
                __import__(module)  # only probing that the extra is installed
            except ImportError as e:
                raise ValueError(
                    f"env.id={env_id!r} needs {what}, which is not installed. "
                    f"Install the extra: {hint}"
                ) from e


class BadObservation(Exception):
    """An env that broke without raising: an observation that does not fit its space."""


def finite(arr: np.ndarray) -> bool:
    # A few numbers (most state observations) are checked faster one by one
    # than by a ufunc, whose call costs more than CartPole's whole observation.
    return (
        all(map(math.isfinite, arr.ravel().tolist()))
        if arr.size <= 16
        else bool(np.isfinite(arr).all())
    )


def observation_problem(obs: Any, space: gym.spaces.Box) -> str | None:
    """What is wrong with ``obs`` for ``space`` (its shape, its dtype, a NaN or an
    infinity), or None. Under a microsecond for CartPole's, a few percent of its step."""
    arr = obs if isinstance(obs, np.ndarray) else np.asarray(obs)
    if arr.shape != space.shape:
        return f"an observation of shape {arr.shape}, where its observation space has {space.shape}"
    if arr.dtype != space.dtype and not np.can_cast(arr.dtype, space.dtype, "same_kind"):
        return f"an observation of dtype {arr.dtype}, where its observation space has {space.dtype}"
    if arr.dtype.kind == "f" and not finite(arr):
        return f"an observation that is not finite: {np.array2string(arr, threshold=8)}"
    return None


class RestartingEnv(gym.Wrapper):
    """An env that is made again when it fails, up to ``max_restarts`` times.

    A failure is an exception from ``step``, or, with ``check_obs``, an
    observation from ``step`` or ``reset`` that does not fit the observation
    space (shape, dtype, NaN or infinity), which Python never raises for: the
    policy would fail on it later, far from the env. A step that fails ends
    the episode there: it returns the last good observation, reward 0 and
    ``truncated``, with ``info["env_restarted"]``, and the vector env's
    autoreset then resets a new copy, seeded anew. The broken episode's return
    is not counted (the collector drops it). Past ``max_restarts`` (0: the
    first failure) the error names the env, its seed, its index and the step.
    ``watchdog`` bounds every ``step`` and ``reset`` (:mod:`harness.collect.watchdog`).
    """

    def __init__(
        self,
        make: Callable[[], gym.Env],
        env_id: str,
        max_restarts: int,
        index: int = 0,
        check_obs: bool = True,
        watchdog: StepWatchdog | None = None,
    ):
        super().__init__(make())
        self.make, self.env_id, self.max_restarts, self.index = make, env_id, max_restarts, index
        self.watchdog = watchdog
        space = self.env.observation_space
        self.space = space if check_obs and isinstance(space, gym.spaces.Box) else None
        self.restarts, self.steps = 0, 0  # steps: of this copy's current episode
        self.seed: int | None = None
        self.last_obs: Any = None
        self.broken = False

    def describe(self) -> str:
        where = f"seed {self.seed}, index {self.index}, step {self.steps} of its episode"
        return f"env {self.env_id} ({where})"

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        if seed is not None:
            self.seed = seed
        while True:
            if self.broken:
                self.env.close()
                self.env, self.broken = self.make(), False
                # A new seed: the old one would replay the episode that broke.
                seed = None if self.seed is None else self.seed + 1_000_003 * self.restarts
            self.steps = 0
            obs, info = self._watched(self.env.reset, seed=seed, options=options)
            problem = None if self.space is None else observation_problem(obs, self.space)
            if problem is None:
                self.last_obs = obs
                return obs, info
            self._failed(BadObservation(f"returned {problem} (collector.check_obs)"))
            self.broken = True

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        # The hot path (CartPole steps in microseconds): the watchdog's slot is written, and
        # the observation checked, inline, without a call of this class's own in between.
        self.steps += 1
        watch = self.watchdog
        try:
            if watch is not None:
                watch.current = (self.describe, time.monotonic())
            obs, reward, terminated, truncated, info = self.env.step(action)
            if watch is not None:
                watch.current = None
            if (
                self.space is not None
                and (problem := observation_problem(obs, self.space)) is not None
            ):
                raise BadObservation(f"returned {problem} (collector.check_obs)")
        # any failure of the env's own code, or an observation that does not fit
        except Exception as e:
            if watch is not None:
                watch.current = None
            self._failed(e)
            self.broken = True
            return self.last_obs, 0.0, False, True, {"env_restarted": True}
        self.last_obs = obs
        return obs, reward, terminated, truncated, info

    def _watched(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.watchdog is None:
            return call(*args, **kwargs)
        self.watchdog.enter(self.describe)
        try:
            return call(*args, **kwargs)
        finally:
            self.watchdog.leave()

    def _failed(self, e: Exception) -> None:
        """Count a failure; past the limit, raise it, named."""
        self.restarts += 1
        what = str(e) if isinstance(e, BadObservation) else f"raised {type(e).__name__}: {e}"
        if self.restarts > self.max_restarts:
            verb = "broke" if isinstance(e, BadObservation) else "raised"
            raise RuntimeError(
                f"{self.describe()} {verb} {self.restarts} times, more than "
                f"collector.max_env_restarts={self.max_restarts}; the last time it {what}"
            ) from e
        log.warning(
            "%s %s; making it again (restart %d of at most %d)",
            self.describe(),
            what,
            self.restarts,
            self.max_restarts,
        )


def make_vec_env(
    env_id: str,
    num_envs: int,
    max_episode_steps: int | None = None,
    max_restarts: int = 0,
    check_obs: bool = True,
    step_timeout_s: float = 0.0,
    training: bool = True,
) -> gym.vector.SyncVectorEnv:
    """``num_envs`` copies stepped in one process (the caller resets and seeds).

    Same-step autoreset: when an episode ends, ``step`` already returns the
    next episode's first observation, so every stored frame is a real one.
    Each copy is a :class:`RestartingEnv`: made again up to ``max_restarts``
    times when it fails (0: the first failure ends the process, named), its
    observations checked with ``check_obs``, its steps bounded by
    ``step_timeout_s`` (0: unbounded). ``training=False``: made for
    evaluation (:func:`made_for`).
    """
    check_env_id(env_id)
    bound, flavour = watchdog(step_timeout_s), made_for(env_id, training)

    def make_one() -> gym.Env:
        return gym.make(env_id, max_episode_steps=max_episode_steps, **flavour)

    def make(index: int) -> Callable[[], gym.Env]:
        return lambda: RestartingEnv(make_one, env_id, max_restarts, index, check_obs, bound)

    return gym.vector.SyncVectorEnv(
        [make(i) for i in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


def spec_of(envs: gym.vector.VectorEnv) -> EnvSpec:
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"observations must be a Box space; got {obs_space}")
    obs_shape = tuple(obs_space.shape)
    if len(obs_shape) == 3 and obs_space.dtype != np.uint8:
        raise ValueError(
            f"image observations {obs_shape} of dtype {obs_space.dtype}: the harness takes images "
            "as uint8, channels first (harness/collect/pixels.py has wrappers that make them so)"
        )
    # images stay bytes; state vectors are stored as float32
    obs_dtype = "uint8" if len(obs_shape) == 3 else "float32"
    if isinstance(act_space, gym.spaces.Discrete):
        return EnvSpec(obs_shape, True, (), int(act_space.n), obs_dtype=obs_dtype)
    if isinstance(act_space, gym.spaces.Box):
        return EnvSpec(
            obs_shape,
            False,
            tuple(act_space.shape),
            int(np.prod(act_space.shape)),
            tuple(float(x) for x in act_space.low.ravel()),
            tuple(float(x) for x in act_space.high.ravel()),
            obs_dtype,
        )
    raise ValueError(f"action space {act_space} is not supported: use Discrete or Box")


def reports_games(envs: gym.vector.VectorEnv) -> bool:
    """Whether the envs report whole games apart from the learner's episodes (Atari:
    harness.collect.pixels; envpool's, harness.collect.envpool_envs)."""
    if getattr(envs, "reports_games", False):
        return True
    try:
        return bool(getattr(envs, "envs")[0].get_wrapper_attr("reports_games"))  # noqa: B009  (a SyncVectorEnv's)
    except AttributeError:
        return False


def made_for(env_id: str, training: bool) -> dict[str, bool]:
    """gym.make's extra arguments: an env registered with a ``training`` flag (Atari's: lives as
    episodes, clipped rewards) is made with ``training=False`` for evaluation (Atari's: whole games,
    raw rewards, served after lost lives, and the same cut-off in frames)."""
    return (
        {"training": training} if "training" in gym.spec(env_id.rpartition(":")[2]).kwargs else {}
    )


def episode_cutoff(env_id: str, max_episode_steps: int | None = None) -> int | None:
    """An episode's cut-off in steps: ``env.max_episode_steps``, else the registered time limit."""
    if max_episode_steps is not None:
        return max_episode_steps
    return gym.spec(env_id.rpartition(":")[2]).max_episode_steps


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
