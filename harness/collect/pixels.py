"""Image-observation envs, made the way the networks take images: uint8, channels first.

Atari (``pip install -e '.[atari]'``: ale-py, ROMs included): registered as
``harness/Atari-<Game>-v5`` (``conf/env/breakout.yaml``, ...) and played by the rules of
Stable-Baselines3's Atari wrappers as CleanRL's ``ppo_atari.py`` and ``dqn_atari.py`` put them
together on gym's ``<Game>NoFrameskip-v4`` (the env of their published scores; docs/pixels.md
names the figures and every difference). The emulator is ``ALE/<Game>-v5`` made with
NoFrameskip-v4's settings (no frame skip in the emulator, sticky actions 0 where v5 has 0.25, the
minimal action set, at most 108,000 emulator frames a game); on it, as SB3's wrappers do: 1 to 30
single-frame no-ops at a game's start (``NoopResetEnv``), each action repeated for 4 frames with
the last two max-pooled (``MaxAndSkipEnv``), FIRE and then action 2 after a (re)start in games
that have FIRE (``FireResetEnv``), 84x84 grayscale (OpenCV's INTER_AREA), 4 frames stacked, the
first repeated to fill the stack. For training (``training=True``, what collectors make) also a
lost life ends the learner's episode and its next reset is one no-op step, not a new game
(``EpisodicLifeEnv``), and rewards are clipped to their sign (``ClipRewardEnv``);
``tests/collect/test_sb3_atari_rules.py`` holds this flavour against SB3's wrappers. The
returns reported (``train/episode_return``, evaluations) are the whole game's, unclipped:
:class:`GameStats` counts them below the training wrappers, and evaluation makes the env with
``training=False``, where a game is one episode and, since a greedy policy may never press FIRE,
a lost life is followed by the presses the training flavour starts its next episode with
(:class:`ServeAfterLostLife`). Grayscale is the ALE's own, max-pooled, then resized (gymnasium's
``AtariPreprocessing``); SB3's ``WarpFrame`` converts the max-pooled colour frame, then resizes,
and CleanRL's scripts resize it, then convert: on Breakout the frames are SB3's exactly and within
1 gray level of CleanRL's; in other games a few pixels differ where moving objects overlap.

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
# A game's cut-off in emulator frames (30 minutes at 60 Hz), training and evaluation alike: the
# ALE's, as NoFrameskip-v4 sets it; 27,000 agent steps of 4 frames.
MAX_GAME_FRAMES = 108_000


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
    """After every (re)start, FIRE and then action 2, each an agent step, as SB3's ``FireResetEnv``
    does: games such as Breakout wait for FIRE."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        self.env.reset(**kwargs)
        info: dict = {}
        for press in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(press)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


class ServeAfterLostLife(gym.Wrapper):
    """Evaluation, in games with FIRE: after a step that loses a life (not the last), the steps
    the training flavour starts its next episode with (a no-op, FIRE, then action 2) are played
    within that step, their rewards added to it. Breakout waits for FIRE after a lost life, so
    without them a policy that never presses it (greedy ones can) plays on to the game's 108,000
    frame cut-off."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()  # type: ignore[attr-defined]
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        reward = float(reward)
        lives = self.env.unwrapped.ale.lives()  # type: ignore[attr-defined]
        if 0 < lives < self.lives:
            for press in (0, 1, 2):
                if terminated or truncated:
                    break
                obs, more, terminated, truncated, info = self.env.step(press)
                reward += float(more)
        self.lives = self.env.unwrapped.ale.lives()  # type: ignore[attr-defined]
        return obs, reward, terminated, truncated, info


def make_atari(game: str, training: bool = True, **kwargs: Any) -> gym.Env:
    """Atari's ``game`` (``Breakout``, ...) by the rules the module names; ``training``: with the
    learner's episodes (lives) and clipped rewards, else whole games served after lost lives."""
    import ale_py  # an extra: check_env_id names it when missing

    gym.register_envs(ale_py)
    env: gym.Env = gym.make(
        f"ALE/{game}-v5",  # with NoFrameskip-v4's settings: CleanRL's published scores' env
        frameskip=1,
        repeat_action_probability=0.0,
        full_action_space=False,
        max_num_frames_per_episode=MAX_GAME_FRAMES,
        **kwargs,
    )
    env = GameStats(gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84))
    fire = "FIRE" in env.unwrapped.get_action_meanings()  # type: ignore[attr-defined]
    if training:
        env = EpisodicLife(env)
    elif fire:
        env = ServeAfterLostLife(env)
    if fire:
        # training: after each lost life too (a reset of EpisodicLife); evaluation: at the start
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
