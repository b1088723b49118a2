"""CartPole that breaks when told, for benchmarks/chaos.py: the env faults of a chaos schedule.

``env.id=chaos_env:ChaosCartPole-v0`` (with ``benchmarks/`` on the path) imports this module,
which registers it. Every ``CHAOS_POLL_STEPS`` steps of a process (default 61, a prime: any env
of a vector may be the one) an env looks in the directory ``CHAOS_DIR`` for a file named
``raise`` or ``nan``; the first env of any process that removes it (an unlink succeeds once)
breaks on that step: it raises, or returns an observation holding a NaN
(which the collector's ``collector.check_obs`` catches). The chaos runner writes the file at a
random time, so the fault lands in whichever collector steps first. Each step also sleeps
``CHAOS_STEP_S`` seconds (default 0.002): time, not CPU, so that the job's pace depends little on
what else the machine runs, and a run of so many frames lasts about as long on every machine.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv

POLL = int(os.environ.get("CHAOS_POLL_STEPS", "61"))
PAUSE_S = float(os.environ.get("CHAOS_STEP_S", "0.002"))


class ChaosCartPole(CartPoleEnv):
    steps = 0  # this process's, all instances together

    def step(self, action):
        time.sleep(PAUSE_S)
        obs, reward, terminated, truncated, info = super().step(action)
        ChaosCartPole.steps += 1
        folder = os.environ.get("CHAOS_DIR")
        if folder and ChaosCartPole.steps % POLL == 0:
            for mode in ("raise", "nan"):
                try:
                    (Path(folder) / mode).unlink()
                except FileNotFoundError:
                    continue
                if mode == "raise":
                    raise RuntimeError(f"chaos: an env raised (pid {os.getpid()})")
                obs = np.array([0.0, np.nan, 0.0, 0.0], dtype=np.float32)
        return obs, reward, terminated, truncated, info


gym.register("ChaosCartPole-v0", entry_point="chaos_env:ChaosCartPole", max_episode_steps=500)
