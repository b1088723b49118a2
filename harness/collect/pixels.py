"""Image-observation envs, made the way the networks take images: uint8, channels first.

MinAtar (Young and Tian 2019; ``pip install -e '.[minatar]'``): 10x10 versions
of five Atari games, one channel per kind of object. Registered here as
``harness/MinAtar-<Game>-v1`` (``conf/env/minatar_*.yaml``): MinAtar's own
``MinAtar/<Game>-v1`` (minimal action set, sticky actions 0.1, its difficulty
ramp), its boolean ``[10, 10, C]`` observation turned into uint8 ``[C, 10, 10]``
of 0 and 255, so that every image the harness meets is bytes that the
network scales by 1/255 (:class:`harness.algos.nets.PixelEncoder`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

MINATAR_GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
MINATAR_HINT = "pip install -e '.[minatar]'  (or: .venv/bin/pip install MinAtar)"


class ChannelsFirst(gym.ObservationWrapper):
    """``[H, W, C]`` images (bool or uint8) as uint8 ``[C, H, W]``; booleans become 0 and 255."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Box) and space.shape is not None and len(space.shape) == 3
        height, width, channels = space.shape
        self.scale = 255 if space.dtype == np.bool_ else 1
        self.observation_space = gym.spaces.Box(0, 255, (channels, height, width), np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(observation, -1, 0), dtype=np.uint8) * np.uint8(self.scale)


def make_minatar(game: str, **kwargs: Any) -> gym.Env:
    """MinAtar's ``game`` (``Breakout``, ...), channels first."""
    import minatar.gym  # an extra: check_env_id names it when missing

    if f"MinAtar/{game}-v1" not in gym.registry:
        minatar.gym.register_envs()
    return ChannelsFirst(gym.make(f"MinAtar/{game}-v1", **kwargs))


def register() -> None:
    for game in MINATAR_GAMES:
        gym.register(f"harness/MinAtar-{game}-v1", entry_point=f"{__name__}:make_minatar", kwargs={"game": game})
