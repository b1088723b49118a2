"""Atari as the harness makes it (harness/collect/pixels.py): the evaluation flavour's preprocessing
against SB3's Atari rules written out step by step on the raw emulator (the training flavour is held
against SB3's own wrappers in test_sb3_atari_rules.py), the training flavour's lives, FIRE and
clipped rewards against the games it reports, and evaluation episodes that end without FIRE."""

from __future__ import annotations

import ale_py
import cv2
import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import column, rows, run_harness
from tensordict import TensorDict

from harness.algos import algorithm_for
from harness.algos.base import Policy
from harness.collect.envs import env_spec, make_vec_env
from harness.collect.evaluate import evaluate, make_eval_envs
from harness.collect.rollout import RolloutCollector
from harness.metrics import video
from harness.sync import Header

BREAKOUT = "harness/Atari-Breakout-v5"


def reference_observations(seed: int, actions: list[int]) -> list[np.ndarray]:
    """SB3's Atari rules (``NoopResetEnv``, ``MaxAndSkipEnv``, ``FireResetEnv``, ``WarpFrame``, as
    CleanRL's ``ppo_atari.py`` uses them) on the raw emulator, step by step: 1 to 30 no-ops after
    the reset (drawn from the env's generator, as ``NoopResetEnv`` draws them), then each action
    repeated for 4 emulator frames, the grayscale screens of the last two max-pooled and shrunk to
    84x84 (OpenCV's INTER_AREA), starting with FIRE and then action 2, and the newest 4 of these
    stacked oldest first, the first frame repeated to fill the stack at the start."""
    gym.register_envs(ale_py)
    env = gym.make("BreakoutNoFrameskip-v4")  # SB3's rules' env: no frame skip, no sticky actions
    env.reset(seed=seed)
    ale = env.unwrapped.ale
    for _ in range(env.unwrapped.np_random.integers(1, 31)):
        env.step(0)

    def agent_step(action: int) -> np.ndarray:
        screens = []
        for _ in range(4):
            env.step(action)
            screens.append(ale.getScreenGrayscale())
        return cv2.resize(
            np.maximum(screens[-2], screens[-1]), (84, 84), interpolation=cv2.INTER_AREA
        )

    agent_step(1)  # FIRE, which Breakout waits for
    frames = [agent_step(2)] * 4  # then action 2, as FireResetEnv presses
    stacks = [np.stack(frames)]
    for action in actions:
        frames = [*frames[1:], agent_step(action)]
        stacks.append(np.stack(frames))
    env.close()
    return stacks


@pytest.mark.unit
def test_preprocessing_matches_sb3s_rules_written_out_on_the_emulator():
    """The evaluation flavour (no lives, raw rewards): frame skip with max-pooling, 84x84 grayscale,
    stack order, the no-op start, FIRE and action 2, frame for frame."""
    actions = [1, 1, 2, 3, 2, 0, 1, 3, 3, 2, 1, 0]
    envs = make_vec_env(BREAKOUT, 1, training=False)
    obs, _ = envs.reset(seed=5)
    seen = [obs[0]]
    for action in actions:
        obs, *_ = envs.step(np.array([action]))
        seen.append(obs[0])
    envs.close()
    expected = reference_observations(5, actions)
    assert all(o.shape == (4, 84, 84) and o.dtype == np.uint8 for o in seen)
    for step, (got, want) in enumerate(zip(seen, expected)):
        assert np.array_equal(got, want), f"step {step}"
    assert not np.array_equal(
        seen[-1][-1], seen[-1][-2]
    )  # the ball moved: the newest frame is last


@pytest.mark.unit
def test_a_lost_life_ends_a_training_episode_but_not_the_reported_game():
    envs = make_vec_env(BREAKOUT, 1)  # the training flavour, as collectors make it
    envs.reset(seed=3)
    ale = envs.envs[0].unwrapped.ale
    rng = np.random.default_rng(0)
    episodes, games, clipped_sum, rewards = 0, [], 0.0, set()
    for _ in range(5_000):
        _, reward, terminated, truncated, info = envs.step(rng.integers(0, 4, size=1))
        rewards.add(float(reward[0]))
        clipped_sum += float(reward[0])
        if terminated[0] or truncated[0]:
            episodes += 1
            final = info["final_info"]
            if final.get("_game_return", [False])[0]:
                games.append(float(final["game_return"][0]))
                break
            assert ale.lives() > 0  # a life lost: the game goes on, not reset to a new one
    envs.close()
    assert len(games) == 1 and episodes == 5, (
        episodes,
        games,
    )  # Breakout's 5 lives: 5 learner's episodes, 1 game
    assert rewards <= {0.0, 1.0}  # clipped for the learner
    assert games[0] >= clipped_sum > 0  # the raw return: Breakout's bricks are worth 1, 4 or 7


class NeverFires(Policy):
    """Breakout's NOOP in every env, as a greedy policy that has not learnt to serve plays;
    counts the steps it is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def forward(self, obs, values=None, deterministic=False):
        self.steps += 1
        noop = torch.zeros(len(obs), dtype=torch.long)
        return TensorDict({"action": noop}, batch_size=[len(obs)])


@pytest.mark.unit
def test_an_evaluation_that_never_presses_fire_ends_every_game_well_before_the_cut_off():
    """Breakout waits for FIRE after a lost life: the evaluation flavour serves then, so each game
    ends in its 5 lives, where without it the game waited for the 108,000-frame cut-off (27,000
    agent steps), the same cut-off in frames as training's."""
    policy = NeverFires()
    envs = make_eval_envs(BREAKOUT, 2, None, render=False)
    training_envs = make_vec_env(BREAKOUT, 1)
    cut_off = envs.envs[0].unwrapped.ale.getInt("max_num_frames_per_episode")
    assert cut_off == training_envs.envs[0].unwrapped.ale.getInt("max_num_frames_per_episode")
    training_envs.close()
    returns = evaluate(policy, envs, seed=3, values={})
    envs.close()
    assert cut_off == 108_000 and len(returns) == 2
    # every game over in a tenth of the cut-off: agent steps of 4 frames (and a few served)
    assert policy.steps * 4 < cut_off / 10, policy.steps


@pytest.mark.unit
def test_the_collector_counts_whole_games_with_raw_returns():
    spec = env_spec(BREAKOUT)
    policy = algorithm_for("ppo", spec).make_policy(algorithm_for("ppo", spec).Config(), spec)
    envs = make_vec_env(BREAKOUT, 2)
    collector = RolloutCollector(envs, policy, 2 * 400, seed=1)
    games = lost_lives = 0.0
    returns = 0.0
    for _ in range(4):
        with torch.no_grad():
            batch = collector.collect(Header(0))
        games += float(batch["stats", "episodes"])
        returns += float(batch["stats", "return_sum"])
        lost_lives += float(batch["rollout", "done"].sum())
    envs.close()
    assert (
        games >= 1 and lost_lives >= 5 * games
    )  # the learner's episodes are lives, the stats count games
    assert (
        returns / games >= 1
    )  # a random Breakout game breaks a brick or more: raw returns, not per life


@pytest.mark.e2e
def test_a_tiny_ppo_atari_run_through_torchrun_with_two_collectors(tmp_path):
    """The preset, shrunk: 1 trainer (every core, compiled) + 2 collectors, uint8 stacks on the
    channel, the Nature CNN on the trainer, games counted with raw returns, the final weights
    evaluated on the evaluation flavour, and a game of them on video (``python -m
    harness.cli.evaluate RUN video=true``)."""
    args = [
        "experiment=ppo_atari",
        "collector.total_frames=1024",
        "collector.num_envs=2",
        "collector.frames_per_batch=256",
        "logger.log_every_frames=512",
        "eval.every_frames=1024",
        "eval.episodes=1",
        # short games keep the run and its video short (evaluation serves after lost lives)
        "env.max_episode_steps=300",
        "run_dir=run",
    ]
    out = run_harness(args, tmp_path, nproc=3, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (
        "(trainer.threads=all: the node's" in out.stdout + out.stderr
    )  # the preset's, over torchrun's one thread
    table = rows(tmp_path / "run")
    assert [int(r["frames"]) for r in table] == [512, 1024]
    assert (
        float(table[-1]["sync/bytes"]) > 4 * 1_600_000
    )  # the actor's Nature CNN: 1.7M float32 parameters
    assert sum(column(table, "train/episodes")) >= 1 and float(table[-1]["eval/final_return"]) >= 0
    # The run's policy replays a game on video: the emulator's colour screen, a frame per agent
    # step.
    shown = run_harness(
        ["run", "episodes=1", "video=true"], tmp_path, module="harness.cli.evaluate"
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    (path,) = (tmp_path / "run" / "videos").glob("evaluate-*.mp4")
    frames = video.read_frames(path)
    assert (
        frames.shape[1:] == (210, 160, 3) and 1 < len(frames) <= 300
    )  # env.max_episode_steps bounds the game


@pytest.mark.e2e
def test_a_tiny_dqn_atari_run_learns_from_its_frame_replay(tmp_path):
    """The DQN preset, shrunk: its replay keeps each frame once (algo.replay_frames) and the trainer
    samples rebuilt stacks from it for its gradient steps."""
    args = [
        "experiment=dqn_atari",
        "collector.total_frames=1024",
        "algo.buffer_size=4096",
        "algo.learning_starts=256",
        "logger.log_every_frames=512",
        "env.max_episode_steps=300",
        "run_dir=run",
    ]
    out = run_harness(args, tmp_path, nproc=3, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    table = rows(tmp_path / "run")
    assert int(table[-1]["frames"]) >= 1024
    assert (
        float(table[-1]["train/replay_size"]) >= 1024
        and float(table[-1]["train/gradient_steps"]) > 0
    )
