"""POPGym (Morad et al. 2023, "POPGym: Benchmarking Partially Observable Reinforcement
Learning"; ``pip install -e '.[popgym]'``): tasks that a policy without memory cannot solve.

Registered here as ``harness/POPGym-<Task>-v0`` (``conf/env/popgym_*.yaml``): POPGym's own
``popgym-<Task>-v0``, which importing ``popgym`` registers, with its observation flattened into a
float32 vector, as the harness's networks take one (gymnasium's flattening: a ``Discrete`` card
becomes one-hot, a ``MultiDiscrete`` or ``Tuple`` their parts' side by side, a ``Box`` stays as
it is). POPGym scales every task's rewards so that the best return of an episode is 1 (and the
worst, where there is one, -1). Its ``PositionOnlyCartPole`` is the paper's Stateless CartPole:
cart position and pole angle, no velocities.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

POPGYM_HINT = "pip install -e '.[popgym]'  (or: .venv/bin/pip install popgym)"
# POPGym 1.0's tasks, each at Easy, Medium and Hard.
POPGYM_TASKS = (
    "Autoencode",
    "RepeatPrevious",
    "RepeatFirst",
    "CountRecall",
    "PositionOnlyCartPole",
    "PositionOnlyPendulum",
    "VelocityOnlyCartpole",
    "NoisyPositionOnlyCartPole",
    "NoisyPositionOnlyPendulum",
    "MultiarmedBandit",
    "HigherLower",
    "Battleship",
    "Concentration",
    "MineSweeper",
)
LEVELS = ("Easy", "Medium", "Hard")


class FlatObservation(gym.ObservationWrapper):
    """An observation from any of gymnasium's spaces as a float32 vector (``flatten_space``)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        flat = gym.spaces.flatten_space(env.observation_space)
        assert isinstance(flat, gym.spaces.Box)  # POPGym's spaces flatten to a Box
        low, high = flat.low.astype(np.float32), flat.high.astype(np.float32)
        self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)

    def observation(self, observation: Any) -> np.ndarray:
        flat = gym.spaces.flatten(self.env.observation_space, observation)
        return np.asarray(flat, dtype=np.float32)


def make_popgym(task: str, **kwargs: Any) -> gym.Env:
    """POPGym's ``task`` (``RepeatPreviousEasy``, ...), its observations flat float32 vectors."""
    import popgym  # noqa: F401  (an extra: check_env_id names it when missing; registers its envs)

    return FlatObservation(gym.make(f"popgym-{task}-v0", **kwargs))


def register() -> None:
    for task in POPGYM_TASKS:
        for level in LEVELS:
            gym.register(
                f"harness/POPGym-{task}{level}-v0",
                entry_point=f"{__name__}:make_popgym",
                kwargs={"task": f"{task}{level}"},
            )
