"""The ale-py Atari env against the rules it says it follows: Stable-Baselines3's own Atari wrappers
(``AtariWrapper``: no-op starts, frame skip with max-pooling, a lost life as the learner's episode
end, FIRE on reset, clipped rewards, 84x84 grayscale) on ``BreakoutNoFrameskip-v4``, stacked 4 deep
as CleanRL's ``ppo_atari.py`` stacks them, played beside the harness's training flavour on one fixed
action sequence. The reference is SB3's code, never the harness's; without stable-baselines3 the
module skips, saying how to install it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

sb3_atari = pytest.importorskip(
    "stable_baselines3.common.atari_wrappers",
    reason="stable-baselines3 (the reference for the ale-py Atari rules) is not installed: "
    ".venv/bin/pip install stable-baselines3 (it needs nothing the harness does not have)",
)
ale_py = pytest.importorskip("ale_py", reason="the atari extra is not installed")

import harness.collect.envs  # noqa: E402,F401  (registers harness/Atari-*)

BREAKOUT = "harness/Atari-Breakout-v5"


def sb3_breakout() -> gym.Env:
    """SB3's rules as CleanRL's ``ppo_atari.py`` sets them: its defaults are ppo_atari.py's
    noop_max=30, skip=4, terminal on life loss, FIRE reset and clipped rewards; the stack repeats
    a reset's frame, as gym's ``FrameStack`` does there."""
    gym.register_envs(ale_py)
    env = sb3_atari.AtariWrapper(gym.make("BreakoutNoFrameskip-v4"))
    return gym.wrappers.FrameStackObservation(env, 4)


@pytest.mark.unit
def test_the_training_flavour_plays_breakout_as_sb3s_wrappers_do():
    """Frame for frame, reward for reward, life for life, through lost lives and whole games."""
    reference, harness_env = sb3_breakout(), gym.make(BREAKOUT)
    want, _ = reference.reset(seed=7)
    got, _ = harness_env.reset(seed=7)
    assert got.shape == (4, 84, 84) and got.dtype == np.uint8
    assert np.array_equal(got, want[..., 0]), "the first stack"
    actions = np.random.default_rng(0).integers(0, 4, size=800)
    lost_lives = games = 0
    for step, action in enumerate(actions.tolist()):
        want, want_reward, want_term, want_trunc, _ = reference.step(action)
        got, reward, terminated, truncated, _ = harness_env.step(action)
        assert (reward, terminated, truncated) == (want_reward, want_term, want_trunc), step
        lives = reference.unwrapped.ale.lives()
        assert harness_env.unwrapped.ale.lives() == lives, step
        game_over = reference.unwrapped.ale.game_over()
        # SB3: "the observation on the done=True frame doesn't matter" (a game cut short mid-skip)
        if not game_over:
            assert np.array_equal(got, want[..., 0]), f"step {step}"
        if terminated or truncated:
            lost_lives += not game_over
            games += game_over
            want, _ = reference.reset()
            got, _ = harness_env.reset()
            assert np.array_equal(got, want[..., 0]), f"the reset after step {step}"
    reference.close()
    harness_env.close()
    assert games >= 2 and lost_lives >= 8, (games, lost_lives)  # the sequence reached both
