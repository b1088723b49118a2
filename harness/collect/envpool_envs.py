"""Atari through envpool (``env.backend=envpool``; ``pip install -e '.[envpool]'``).

The rules are envpool's own, as CleanRL's ``ppo_atari_envpool.py`` plays ``<Game>-v5``: envpool
steps the ALE in C++ threads with its frame skip (4, the last two frames max-pooled), 84x84
grayscale (INTER_AREA), 4 frames stacked, 1 to ``noop_max`` no-ops at a game's start, FIRE after
a (re)start, and the options of :class:`harness.collect.config.EnvpoolConfig`. A collector owns one
envpool batch of ``collector.num_envs`` envs on the threads its placement gives it. Frames are
envpool's uint8 ``[4, 84, 84]``, untouched.

Two things differ from the gymnasium backend and are envpool's (and CleanRL's) as they are:

- next-step autoreset: the step after an episode's end returns the next episode's first
  observation, reward 0, and ignores its action. The rollout keeps that step as an ordinary one,
  as CleanRL's PPO does (its done flag sits on the step before, so no return crosses it).
- whole games are counted as CleanRL's ``RecordEpisodeStatistics`` counts them: the raw rewards
  (``info["reward"]``) and every agent step summed over the lives until the game is over
  (``info["terminated"]``, or the cut-off), and reported in the info of the step that ends it.

Evaluation (``training=False``) plays the same env with ``reward_clip`` off, and one episode is one
game: a lost life there is still envpool's episodic-life reset, which presses FIRE, so that a
policy that never presses it still finishes its games.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from harness.collect.config import EnvpoolConfig
from harness.collect.envs import spec_of
from harness.core.specs import EnvSpec

ENVPOOL_HINT = "pip install -e '.[envpool]'  (or: .venv/bin/pip install envpool==1.2.5)"


def task_of(env_id: str) -> str:
    """envpool's task for one of the harness's Atari envs: ``harness/Atari-Breakout-v5`` ->
    ``Breakout-v5``."""
    spec = gym.spec(env_id.rpartition(":")[2])
    if "make_atari" not in str(spec.entry_point):
        raise ValueError(
            f"env.backend=envpool plays the Atari envs (conf/env/breakout.yaml, pong, ...); "
            f"env.id={env_id!r} is not one: use env.backend=gymnasium"
        )
    return f"{spec.kwargs['game']}-v5"


def check(env_id: str) -> None:
    """At start-up: envpool is installed and plays ``env_id``."""
    task_of(env_id)
    try:
        import envpool  # noqa: F401  (only probing that the extra is installed)
    except ImportError as e:
        raise ValueError(
            f"env.backend=envpool needs envpool, which is not installed ({e}). "
            f"Install the extra: {ENVPOOL_HINT}"
        ) from e


class GameCounter:
    """Each env's game so far, summed as CleanRL's ``RecordEpisodeStatistics`` does for envpool:
    raw rewards and agent steps, over the lives, until the game is over."""

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs)
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def add(self, ids: np.ndarray, raw_reward: np.ndarray, over: np.ndarray) -> dict | None:
        """Counts one step of envs ``ids``; for games it ended, their return and length (the
        gymnasium vector env's ``final_info`` form, indexed like ``ids``), else None."""
        self.returns[ids] += raw_reward
        self.lengths[ids] += 1
        if not over.any():
            return None
        done = {
            "game_return": self.returns[ids].copy(),
            "game_length": self.lengths[ids].copy(),
            "_game_return": over.copy(),
        }
        self.returns[ids[over]] = 0.0
        self.lengths[ids[over]] = 0
        return done


class EnvpoolEnvs:
    """``num_envs`` envs of one envpool batch, as the rollout steps a gymnasium vector env
    (``reset``, ``step``, the single spaces), and, with ``batch_size`` below ``num_envs``,
    envpool's asynchronous ``recv`` and ``send`` (:mod:`harness.collect.async_rollout`).
    ``training=False``: raw rewards and a game per episode (evaluation)."""

    reports_games = True

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        options: EnvpoolConfig,
        threads: int,
        seed: int = 0,
        training: bool = True,
    ):
        check(env_id)
        self.task, self.num_envs, self.options = task_of(env_id), num_envs, options
        self.threads, self.training = threads, training
        self.batch_size = options.batch_size or num_envs
        if self.batch_size > num_envs:
            raise ValueError(
                f"env.envpool.batch_size={options.batch_size} is more than collector.num_envs="
                f"{num_envs}: 0 (synchronous) or fewer envs than the collector has (asynchronous)"
            )
        self.pool = self._make(seed)
        self.single_observation_space = self.pool.observation_space
        self.single_action_space = self.pool.action_space
        self.games = GameCounter(num_envs)
        self.all_ids = np.arange(num_envs)

    def _make(self, seed: int) -> Any:
        import envpool

        o = self.options
        self.seed = seed
        return envpool.make(
            self.task,
            env_type="gymnasium",
            num_envs=self.num_envs,
            batch_size=self.batch_size,
            num_threads=self.threads,
            seed=seed,  # env i: seed + i
            episodic_life=o.episodic_life,
            reward_clip=o.reward_clip and self.training,
            noop_max=o.noop_max,
            use_fire_reset=o.use_fire_reset,
            repeat_action_probability=o.repeat_action_probability,
            full_action_space=o.full_action_space,
            max_episode_steps=o.max_episode_steps,
        )

    @property
    def asynchronous(self) -> bool:
        return self.batch_size < self.num_envs

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        """New games in every env; a new ``seed`` makes the batch again (envpool seeds at make)."""
        if seed is not None and seed != self.seed:
            self.pool.close()
            self.pool = self._make(seed)
        self.games = GameCounter(self.num_envs)
        if self.asynchronous:
            self.pool.async_reset()
            return None, {}
        obs, _ = self.pool.reset()
        return obs, {}

    def step(self, actions: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Every env one step (synchronous mode)."""
        return self._result(self.pool.step(actions), self.all_ids)

    def recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Asynchronous mode: the next ``batch_size`` envs ready; ``info["env_id"]`` names them."""
        result = self.pool.recv()
        ids = result[-1]["env_id"]
        obs, reward, terminated, truncated, info = self._result(result, ids)
        return obs, reward, terminated, truncated, {**info, "env_id": ids}

    def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
        self.pool.send(actions, env_ids)

    def _result(self, result: tuple, ids: np.ndarray) -> tuple:
        obs, reward, terminated, truncated, raw = result
        game_over = raw["terminated"].astype(bool) | truncated
        if not self.training:  # an episode is a game: a lost life does not end it
            terminated, truncated = raw["terminated"].astype(bool), truncated & ~terminated
        info: dict[str, Any] = {}
        games = self.games.add(ids, raw["reward"], game_over)
        if games is not None:  # same keys as a gymnasium vector env's at an episode's end
            info = {"final_obs": obs, "_final_obs": game_over, "final_info": games}
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self.pool.close()


def envpool_spec(env_id: str, options: EnvpoolConfig) -> EnvSpec:
    """The spec of ``env_id`` on envpool, from one env made for the purpose."""
    envs = EnvpoolEnvs(env_id, 1, EnvpoolConfig(**{**vars(options), "batch_size": 0}), 1)
    try:
        return spec_of(envs)  # type: ignore[arg-type]  # the spaces are all it reads
    finally:
        envs.close()
