"""A real gymnasium env that breaks on a chosen step, for the env-restart tests.

``env.id=flaky_env:FlakyCartPole-v0`` (with ``tests/`` on the path) imports
this module, which registers it. CartPole, except that the step number
``FLAKY_STEP`` of an episode breaks, for the first ``FLAKY_FAILURES`` times
in this process (environment variables, since ranks are separate processes),
in the way ``FLAKY_MODE`` says:

- ``raise`` (the default): it raises;
- ``nan``: it returns an observation holding a NaN, which Python never raises for;
- ``shape``: it returns an observation of the wrong shape (5 numbers, not 4);
- ``hang``: it never returns (it waits forever, the GIL released);
- ``hold``: it never returns and holds the GIL (a C call that never ends);
- ``kill``: the process dies of SIGKILL (as when the OOM killer picks it);
- ``segfault``: the process dies of SIGSEGV (a read of address 0);
- ``abort``: the process aborts (``os.abort``: SIGABRT).

``FLAKY_AFTER``: the failure waits until this process has taken that many
steps (all instances together), e.g. past a collector's first batch.
``FLAKY_ONCE``: a file path; only the one process that creates it fails, so
a replaced collector's worker runs on.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv

failures = 0  # in this process, all instances together
steps = 0


def _claimed() -> bool:
    """This process may fail: no ``FLAKY_ONCE`` file, or it made it first."""
    marker = os.environ.get("FLAKY_ONCE")
    if not marker:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


class FlakyCartPole(CartPoleEnv):
    def reset(self, **kwargs):
        self.episode_steps = 0
        return super().reset(**kwargs)

    def step(self, action):
        global failures, steps
        self.episode_steps += 1
        steps += 1
        obs, reward, terminated, truncated, info = super().step(action)
        due = self.episode_steps == int(os.environ.get("FLAKY_STEP", 10)) and steps > int(
            os.environ.get("FLAKY_AFTER", 0)
        )
        if due and failures < int(os.environ.get("FLAKY_FAILURES", 1)) and _claimed():
            failures += 1
            mode = os.environ.get("FLAKY_MODE", "raise")
            if mode == "nan":
                obs = np.array([0.0, np.nan, 0.0, 0.0], dtype=np.float32)
            elif mode == "shape":
                obs = np.zeros(5, dtype=np.float32)
            elif mode == "hang":
                threading.Event().wait()  # a step that never returns
            elif mode == "hold":
                ctypes.PyDLL(
                    None
                ).pause()  # PyDLL: the GIL stays held while pause() waits for a signal
            elif mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif mode == "segfault":
                ctypes.string_at(0)
            elif mode == "abort":
                os.abort()
            else:
                raise RuntimeError(f"simulated crash at step {self.episode_steps} of an episode")
        return obs, reward, terminated, truncated, info


gym.register("FlakyCartPole-v0", entry_point=FlakyCartPole, max_episode_steps=500)
