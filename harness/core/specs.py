"""What the algorithms know of an env: its observation and action spaces, as plain numbers.

The vocabulary every algorithm and every env module shares, in a room of its
own below both (``harness.collect.envs.env_spec`` reads one off a gymnasium
env), so that neither imports the other for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvSpec:
    """What the networks need to know about an env: read from the env itself."""

    obs_shape: tuple[int, ...]
    discrete: bool
    action_shape: tuple[int, ...]  # () for discrete
    num_actions: int  # discrete: number of actions; continuous: action dims
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    # as collectors store and send observations: float32, or uint8 for images
    obs_dtype: str = "float32"

    @property
    def obs_dim(self) -> int:
        """Observations flattened, as the MLPs take them."""
        return math.prod(self.obs_shape)

    @property
    def pixels(self) -> bool:
        """Images, channels first (``[C, H, W]``, uint8): the networks take them through a CNN."""
        return len(self.obs_shape) == 3
