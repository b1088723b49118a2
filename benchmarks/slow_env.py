"""CartPole whose step takes time, and three times as long on one collector: the
uneven env that benchmarks/slow_collector.py runs sync and async PPO on.

``env.id=slow_env:SlowCartPole-v0`` (with ``benchmarks/`` on the path) imports
this module, which registers it. Each step sleeps ``SLOW_STEP_S`` seconds
(default 0.0025), ``SLOW_FACTOR`` times that (default 3) in the rank named by
``SLOW_RANK`` (torchrun's ``RANK``; none by default): environment variables,
since every rank is its own process.
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class SlowCartPole(CartPoleEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        slowed = os.environ.get("RANK") == os.environ.get("SLOW_RANK")
        self.pause_s = float(os.environ.get("SLOW_STEP_S", "0.0025")) * (
            float(os.environ.get("SLOW_FACTOR", "3")) if slowed else 1
        )

    def step(self, action):
        # an env step that costs time but not CPU: the 2 cores stay the trainer's
        time.sleep(self.pause_s)
        return super().step(action)


gym.register("SlowCartPole-v0", entry_point=SlowCartPole, max_episode_steps=500)
