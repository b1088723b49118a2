"""env.backend=envpool (harness/collect/envpool_envs.py) held against envpool itself: the
reference is envpool called directly, with the arguments CleanRL's ``ppo_atari_envpool.py`` makes
its envs with, and games summed as its ``RecordEpisodeStatistics`` sums them, written out here.
Skipped where envpool has no wheel (the extra installs nothing there)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import compose_config
from tensordict import TensorDict

from harness.algos.base import Policy
from harness.collect.async_rollout import AsyncRolloutCollector
from harness.collect.config import EnvpoolConfig
from harness.collect.envpool_envs import EnvpoolEnvs
from harness.collect.evaluate import evaluate
from harness.roles.collector import make_collector, make_periodic_evaluation
from harness.sync import Header

envpool = pytest.importorskip("envpool")
BREAKOUT = "harness/Atari-Breakout-v5"


def cleanrl_envs(num_envs: int, seed: int):
    """As ``ppo_atari_envpool.py`` makes them (with gymnasium's step API: the same env)."""
    return envpool.make(
        "Breakout-v5",
        env_type="gymnasium",
        num_envs=num_envs,
        episodic_life=True,
        reward_clip=True,
        seed=seed,
        num_threads=1,
    )


@pytest.mark.unit
def test_the_backend_steps_as_envpool_does_and_counts_games_as_cleanrl_does():
    """A fixed action sequence through both: the same frames (uint8 stacks), clipped rewards and
    episode ends at every step; the games reported are the raw rewards and steps summed over the
    lives until ``info["terminated"]``, as CleanRL sums them."""
    actions = np.random.default_rng(0).integers(0, 4, size=(600, 2)).astype(np.int32)
    ours = EnvpoolEnvs(BREAKOUT, 2, EnvpoolConfig(), threads=1, seed=7)
    reference = cleanrl_envs(2, seed=7)
    obs, _ = ours.reset()
    want, _ = reference.reset()
    assert obs.dtype == np.uint8 and obs.shape == (2, 4, 84, 84) and np.array_equal(obs, want)
    returns, lengths = np.zeros(2), np.zeros(2, dtype=np.int64)
    games, reported, lives_lost = [], [], 0
    for step, action in enumerate(actions):
        obs, reward, terminated, truncated, info = ours.step(action)
        want, want_reward, want_terminated, want_truncated, raw = reference.step(action)
        assert np.array_equal(obs, want), f"step {step}"
        assert np.array_equal(reward, want_reward) and np.array_equal(terminated, want_terminated)
        assert np.array_equal(truncated, want_truncated), f"step {step}"
        returns += raw["reward"]
        lengths += 1
        lives_lost += int(terminated.sum())
        for i in np.flatnonzero(raw["terminated"]):
            games.append((step, int(i), float(returns[i]), int(lengths[i])))
            returns[i], lengths[i] = 0.0, 0
        if "final_info" in info:
            final = info["final_info"]
            for i in np.flatnonzero(final["_game_return"]):
                reported.append(
                    (step, int(i), float(final["game_return"][i]), int(final["game_length"][i]))
                )
    ours.close()
    reference.close()
    assert len(games) >= 2 and lives_lost >= 5 * len(games)  # lives end episodes, not games
    assert reported == games


class FirstAction(Policy):
    """Acts ``(step + env's first pixel) % 4``: actions that differ by env and by step, from the
    observation alone, so a column of the batch can be replayed; counts its steps."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def forward(self, obs, values=None, deterministic=False):
        self.steps += 1
        action = (obs[:, -1, 40, :].sum(dim=1).long() + self.steps) % 4
        return TensorDict({"action": action}, batch_size=[len(obs)])


@pytest.mark.unit
def test_the_asynchronous_mode_fills_each_envs_column_with_that_envs_own_steps():
    """envpool's asynchronous mode (2 of 4 envs a step, in whatever order they are ready): each
    column of two batches in a row is one env's steps, frame for frame as envpool's own env with
    that env's seed plays the column's actions; the observation to bootstrap from is the one after
    the column's last step."""
    seed, steps = 11, 64
    envs = EnvpoolEnvs(BREAKOUT, 4, EnvpoolConfig(batch_size=2), threads=1, seed=seed)
    collector = AsyncRolloutCollector(envs, FirstAction(), 4 * steps, seed)
    batches = [collector.collect(Header(v)).clone() for v in range(2)]
    envs.close()
    for i in range(4):
        column = torch.cat([b["rollout"][:, i] for b in batches])
        reference = cleanrl_envs(1, seed=seed + i)  # envpool seeds env i with seed + i
        obs, _ = reference.reset()
        for t in range(2 * steps):
            assert np.array_equal(column["obs"][t].numpy(), obs[0]), f"env {i}, step {t}"
            action = column["action"][t : t + 1].numpy().astype(np.int32)
            obs, reward, terminated, truncated, _ = reference.step(action)
            assert float(column["reward"][t]) == float(reward[0])
            assert bool(column["terminated"][t]) == bool(terminated[0])
            assert bool(column["done"][t]) == bool(terminated[0] or truncated[0])
        assert np.array_equal(batches[1]["next_obs"][i].numpy(), obs[0]), f"env {i}"
        reference.close()


class NeverFires(Policy):
    """Breakout's NOOP in every env, as a greedy policy that has not learnt to serve plays."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def forward(self, obs, values=None, deterministic=False):
        self.steps += 1
        return TensorDict({"action": torch.zeros(len(obs), dtype=torch.long)}, [len(obs)])


@pytest.mark.unit
def test_a_collector_and_its_evaluation_on_envpool_from_the_config():
    """``env.backend=envpool env.envpool.batch_size=2``: the collector is the asynchronous one on
    one envpool batch, its batch uint8 stacks of every env's steps; its evaluation plays envpool's
    env with raw rewards, and a policy that never presses FIRE still ends every game in its 5 lives
    (envpool presses FIRE after a lost life), far before the cut-off of 27,000 agent steps."""
    cfg = compose_config(
        "experiment=ppo_atari",
        "env.backend=envpool",
        "env.envpool.batch_size=2",
        "collector.frames_per_batch=64",
        "eval.every_frames=64",
        "eval.episodes=2",
    )
    collector, *_ = make_collector(cfg, rank=1)
    assert isinstance(collector, AsyncRolloutCollector)
    batch = collector.collect(Header(0))
    assert batch["rollout", "obs"].dtype == torch.uint8 and batch["rollout"].shape == (16, 4)
    evaluation = make_periodic_evaluation(cfg, collector, first=True)
    assert evaluation is not None
    policy = NeverFires()
    returns = evaluate(policy, evaluation.evaluation.envs, seed=3, values={})
    collector.envs.close()
    evaluation.close()
    assert len(returns) == 2 and policy.steps < 2_700, policy.steps


@pytest.mark.unit
def test_settings_envpool_cannot_play_are_refused_at_start_up_naming_the_fix():
    with pytest.raises(ValueError, match=r"plays the Atari envs.*use env.backend=gymnasium"):
        compose_config("env=cartpole", "env.backend=envpool")
    with pytest.raises(ValueError, match=r"env.envpool.batch_size=4 with collector.num_envs=4"):
        compose_config("experiment=ppo_atari_envpool", "env.envpool.batch_size=4")
    with pytest.raises(ValueError, match=r"set env.envpool.max_episode_steps"):
        compose_config("experiment=ppo_atari_envpool", "env.max_episode_steps=300")
    with pytest.raises(ValueError, match=r"env.backend='gym': choose gymnasium or envpool"):
        compose_config("env=breakout", "env.backend=gym")
