"""A real gymnasium env that breaks on a chosen step, for the env-restart tests.

``env.id=flaky_env:FlakyCartPole-v0`` (with ``tests/`` on the path) imports
this module, which registers it. CartPole, except that the step number
``FLAKY_STEP`` of an episode breaks, for the first ``FLAKY_FAILURES`` times
in this process (environment variables, since ranks are separate processes),
in the way ``FLAKY_MODE`` says:

- ``raise`` (the default): it raises;
- ``nan``: it returns an observation holding a NaN, which Python never raises for;
- ``shape``: it returns an observation of the wrong shape (5 numbers, not 4);
- ``hang``: it never returns (it sleeps for a day).
"""

from __future__ import annotations

import os
import threading

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv

failures = 0  # in this process, all instances together


class FlakyCartPole(CartPoleEnv):
    def reset(self, **kwargs):
        self.episode_steps = 0
        return super().reset(**kwargs)

    def step(self, action):
        global failures
        self.episode_steps += 1
        obs, reward, terminated, truncated, info = super().step(action)
        if self.episode_steps == int(os.environ.get("FLAKY_STEP", 10)) and failures < int(os.environ.get("FLAKY_FAILURES", 1)):
            failures += 1
            mode = os.environ.get("FLAKY_MODE", "raise")
            if mode == "nan":
                obs = np.array([0.0, np.nan, 0.0, 0.0], dtype=np.float32)
            elif mode == "shape":
                obs = np.zeros(5, dtype=np.float32)
            elif mode == "hang":
                threading.Event().wait()  # a step that never returns
            else:
                raise RuntimeError(f"simulated crash at step {self.episode_steps} of an episode")
        return obs, reward, terminated, truncated, info


gym.register("FlakyCartPole-v0", entry_point=FlakyCartPole, max_episode_steps=500)
