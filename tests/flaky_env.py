"""A real gymnasium env that raises on a chosen step, for the env-restart tests.

``env.id=flaky_env:FlakyCartPole-v0`` (with ``tests/`` on the path) imports
this module, which registers it. CartPole, except that the step number
``FLAKY_STEP`` of an episode raises, for the first ``FLAKY_FAILURES`` times
in this process (environment variables, since ranks are separate processes).
"""

from __future__ import annotations

import os

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv

failures = 0  # in this process, all instances together


class FlakyCartPole(CartPoleEnv):
    def reset(self, **kwargs):
        self.episode_steps = 0
        return super().reset(**kwargs)

    def step(self, action):
        global failures
        self.episode_steps += 1
        if self.episode_steps == int(os.environ.get("FLAKY_STEP", 10)) and failures < int(os.environ.get("FLAKY_FAILURES", 1)):
            failures += 1
            raise RuntimeError(f"simulated crash at step {self.episode_steps} of an episode")
        return super().step(action)


gym.register("FlakyCartPole-v0", entry_point=FlakyCartPole, max_episode_steps=500)
