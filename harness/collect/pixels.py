"""Image-observation envs, made the way the networks take images: uint8, channels first.

Atari (``pip install -e '.[atari]'``: ale-py, ROMs included): registered as
``harness/Atari-<Game>-v5`` (``conf/env/breakout.yaml``, ...) and preprocessed
as envpool's defaults, with the two options CleanRL's ``ppo_atari_envpool.py``
turns on, so that scores compare with CleanRL's tables: 84x84 grayscale,
4 frames skipped with the last two max-pooled, 4 frames stacked, up to 30
no-op starts, FIRE at the start in games that have it, sticky actions off,
the minimal action set, at most 108k emulator frames a game; for training
(``training=True``, what collectors make) also a lost life ends an episode
for the learner (FIRE after it too), and rewards are clipped to their sign. The
returns reported (``train/episode_return``, evaluations) are the whole game's,
unclipped: :class:`GameStats` counts them below the training wrappers, and
evaluation makes the env with ``training=False``. Against ``ALE/<Game>-v5``'s
defaults: sticky actions 0 (there 0.25), and the frame skip (4, there too)
is done here, max-pooling the last two frames, where v5 returns the last.

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
ATARI_GAMES = ("Breakout", "Pong", "BeamRider", "SpaceInvaders", "Seaquest")
ATARI_HINT = "pip install -e '.[atari]'  (or: .venv/bin/pip install ale-py opencv-python-headless)"


class ChannelsFirst(gym.ObservationWrapper):
    """``[H, W, C]`` images (bool or uint8) as uint8 ``[C, H, W]``; booleans become 0 and 255."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        assert (
            isinstance(space, gym.spaces.Box) and space.shape is not None and len(space.shape) == 3
        )
        height, width, channels = space.shape
        self.scale = 255 if space.dtype == np.bool_ else 1
        self.observation_space = gym.spaces.Box(0, 255, (channels, height, width), np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(observation, -1, 0), dtype=np.uint8) * np.uint8(
            self.scale
        )


def make_minatar(game: str, **kwargs: Any) -> gym.Env:
    """MinAtar's ``game`` (``Breakout``, ...), channels first."""
    import minatar.gym  # an extra: check_env_id names it when missing

    if f"MinAtar/{game}-v1" not in gym.registry:
        minatar.gym.register_envs()
    return ChannelsFirst(gym.make(f"MinAtar/{game}-v1", **kwargs))


class GameStats(gym.Wrapper):
    """Puts the whole game's return and length (raw rewards, every agent step) in the info of the
    step that ends it; wrappers above may clip rewards and end episodes at lost lives (the collector
    reports these games)."""

    reports_games = True

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        self.game_return, self.game_length = 0.0, 0
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_return += float(reward)
        self.game_length += 1
        if terminated or truncated:
            info = {**info, "game_return": self.game_return, "game_length": self.game_length}
        return obs, reward, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """A lost life ends the learner's episode (``terminated``) without resetting the game: the next
    ``reset`` only steps a no-op, unless the game is over."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        if getattr(self, "game_over", True):
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives, self.game_over = self.env.unwrapped.ale.lives(), False  # type: ignore[attr-defined]
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()  # type: ignore[attr-defined]
        lost = 0 < lives < self.lives
        self.lives = lives
        return obs, reward, terminated or lost, truncated, info


class FireReset(gym.Wrapper):
    """Press FIRE after every (re)start: games such as Breakout wait for it."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


def make_atari(game: str, training: bool = True, **kwargs: Any) -> gym.Env:
    """Atari's ``game`` (``Breakout``, ...), preprocessed as the module says; ``training``: with the
    learner's episodes (lives), FIRE on reset and clipped rewards."""
    import ale_py  # an extra: check_env_id names it when missing

    gym.register_envs(ale_py)
    env: gym.Env = gym.make(
        f"ALE/{game}-v5",
        frameskip=1,
        repeat_action_probability=0.0,
        max_num_frames_per_episode=108_000,
        **kwargs,
    )
    env = GameStats(gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84))
    if training:
        env = EpisodicLife(env)
    if "FIRE" in env.unwrapped.get_action_meanings():  # type: ignore[attr-defined]
        # in training after each lost life too; in evaluation, at the game's start
        env = FireReset(env)
    if training:
        env = gym.wrappers.TransformReward(env, lambda reward: float(np.sign(float(reward))))
    return gym.wrappers.FrameStackObservation(env, 4)


def register() -> None:
    for game in MINATAR_GAMES:
        gym.register(
            f"harness/MinAtar-{game}-v1",
            entry_point=f"{__name__}:make_minatar",
            kwargs={"game": game},
        )
    for game in ATARI_GAMES:
        gym.register(
            f"harness/Atari-{game}-v5",
            entry_point=f"{__name__}:make_atari",
            kwargs={"game": game, "training": True},
        )
