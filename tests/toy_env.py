"""A toy gymnasium env, from outside the package: ``env.id=toy_env:ToyGuess-v0`` (with ``tests/`` on
the path) imports this module, which registers the env, as ``gym.make`` does. No plugin needed.

Every step lights one of two lamps (a one-hot observation); naming the lit lamp earns 1. An
episode lasts ``LENGTH`` steps, so a random policy returns ``LENGTH / 2`` and a learned one
``LENGTH``, and every episode's length is ``LENGTH``: a run's ``train/episode_length`` says it
stepped this env (docs/extending.md; tests/launch/test_extending.py).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

LENGTH = 8


class GuessEnv(gym.Env):
    """Name the lamp that is lit: one of two, drawn anew every step."""

    observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.steps = 0
        return self._light(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward = float(int(action) == self.lit)
        self.steps += 1
        return self._light(), reward, self.steps == LENGTH, False, {}

    def _light(self) -> np.ndarray:
        self.lit = int(self.np_random.integers(2))
        obs = np.zeros(2, np.float32)
        obs[self.lit] = 1.0
        return obs


gym.register("ToyGuess-v0", entry_point=f"{__name__}:GuessEnv")
