"""Observation normalisation and reward scaling: exact statistics, one source
of truth travelling with the policy, checkpoints, several trainers."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
from helpers import compose_config
from omegaconf import OmegaConf

from harness.algos import ALGOS
from harness.algos.base import NormalizedPolicy
from harness.algos.normalize import ObsNormalizer, RewardScaler
from harness.algos.ppo import PPOConfig
from harness.cli.policies import load_policy
from harness.collect.envs import env_spec
from harness.collect.rollout import batch_template
from harness.core import checkpoint
from harness.distributed.topology import Layout
from harness.roles.sources import InlineCollector, connect_batches
from harness.sync import Header
from harness.testing.spawn import run_ranks

PENDULUM = env_spec("Pendulum-v1")
NORMALIZED = ("env=pendulum", "debug=tiny", "algo.normalize_obs=true", "algo.normalize_reward=true")


def stream(seed: int, n: int, shape: tuple[int, ...] = (3,)) -> torch.Tensor:
    """A fixed stream, far from mean 0 and variance 1, with one dimension far from the others."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *shape, generator=g, dtype=torch.float64) * torch.tensor(
        [10.0, 0.1, 3.0]
    ) + torch.tensor([5.0, -2.0, 1e3])


@pytest.mark.unit
def test_running_statistics_equal_a_two_pass_mean_and_variance():
    data = stream(0, 500)
    stats, seen = ObsNormalizer((3,), clip=10.0), 0
    obs = torch.tensor([[5.0, -2.0, 1e3]])
    assert torch.equal(stats(obs), obs.clamp(-10, 10))  # no statistics yet: only the clip
    for size in (1, 7, 64, 3, 200, 225):  # batches of any size, the first a single frame
        stats.update(data[seen : seen + size])
        seen += size
        torch.testing.assert_close(stats.mean, data[:seen].mean(0), rtol=1e-12, atol=1e-9)
        torch.testing.assert_close(
            stats.var, data[:seen].var(0, unbiased=False), rtol=1e-9, atol=1e-12
        )
    assert stats.count == 500
    expected = ((obs.double() - data.mean(0)) / (data.var(0, unbiased=False) + 1e-8).sqrt()).clamp(
        -10, 10
    )
    torch.testing.assert_close(stats(obs), expected.float())
    assert stats(obs).dtype == torch.float32  # what the networks take


@pytest.mark.unit
def test_reward_scale_follows_each_envs_discounted_return_across_rounds():
    g = torch.Generator().manual_seed(1)
    reward = torch.randn(10, 2, generator=g) * 3 + 1
    terminated = torch.zeros(10, 2, dtype=torch.bool)
    terminated[3, 0] = True  # env 0's episode ends at step 3, inside the first round
    terminated[5, 1] = True  # env 1's ends with the first round: the second starts from 0
    gamma, expected, running = (
        0.9,
        torch.zeros(10, 2, dtype=torch.float64),
        torch.zeros(2, dtype=torch.float64),
    )
    for t in range(10):
        running = running * gamma + reward[t]
        expected[t] = running
        running[terminated[t]] = 0.0
    scaler = RewardScaler(gamma, clip=0.4)
    scaler.scale(
        reward[:6], terminated[:6]
    )  # two rounds: the returns carry over from one to the next
    scaled = scaler.scale(reward[6:], terminated[6:])
    torch.testing.assert_close(scaler.return_stats.var, expected.flatten().var(unbiased=False))
    std = (expected.flatten().var(unbiased=False) + 1e-8).sqrt()
    torch.testing.assert_close(scaled, (reward[6:] / std).clamp(-0.4, 0.4).float())
    assert scaled.abs().max() == 0.4  # some scaled rewards were clipped


@pytest.mark.unit
def test_a_collectors_normalised_observations_are_the_trainers_for_the_same_version(tmp_path):
    """World size 1: the real local weight scheme between the trainer's
    algorithm and the collector in its process, three rounds of updates."""
    cfg = compose_config(*NORMALIZED, f"run_dir={tmp_path}")
    torch.manual_seed(cfg.seed)
    algo = ALGOS["ppo"](cfg.algo, PENDULUM, cfg.collector.total_frames)
    connected = connect_batches(cfg, Layout.from_env(1, env={}), None, algo)
    source = connected.batches
    assert isinstance(source, InlineCollector) and connected.publisher is not None
    acting = source.collector.policy
    assert (
        isinstance(acting, NormalizedPolicy) and acting.obs_norm is not algo.obs_norm
    )  # a copy, through the payload
    frames = 0
    for version in range(3):
        connected.publisher.publish(Header(version, frames))  # as the trainer's sync rounds do
        batch = source.receive()[0]
        assert (
            acting.obs_norm.count == algo.obs_norm.count == version * 64
        )  # every frame of the rounds learnt from
        obs, action = batch["rollout", "obs"], batch["rollout", "action"]
        torch.testing.assert_close(acting.obs_norm(obs), algo.normalized(obs), rtol=0, atol=0)
        # The collector acted through those statistics: the trainer's policy gives its actions the
        # stored log-probabilities.
        logprob, _ = algo.policy.log_prob_entropy(
            algo.normalized(obs).flatten(0, 1), action.flatten(0, 1)
        )
        torch.testing.assert_close(
            logprob, batch["rollout", "logprob"].flatten(), rtol=0, atol=1e-5
        )
        metrics = algo.update([batch], frames)
        frames += 64
    assert float(metrics["train/return_std"]) > 0
    source.drain(lambda batch: None)


@pytest.mark.unit
@pytest.mark.parametrize("name", ["ppo", "sac"])
def test_a_checkpoint_keeps_the_statistics_and_evaluation_acts_through_them(tmp_path, name):
    cfg = compose_config(
        f"algo={name}",
        "env=pendulum",
        "algo.normalize_obs=true",
        f"run_dir={tmp_path}",
        *(["algo.normalize_reward=true"] if name == "ppo" else []),
    )
    algo = ALGOS[name](cfg.algo, PENDULUM, cfg.collector.total_frames)
    algo.obs_norm.update(stream(2, 100))
    if name == "ppo":
        algo.reward_scaler.scale(torch.randn(5, 4), torch.zeros(5, 4, dtype=torch.bool))
    OmegaConf.save(OmegaConf.structured(cfg), tmp_path / "config.yaml")
    checkpoint.save(
        tmp_path,
        {"algo": algo.state_dict(), "progress": {"frames": 0}},
        {"algo": name, "env": "Pendulum-v1", "step": 0},
        1,
    )
    state, _, _ = checkpoint.load_latest(tmp_path, name, "Pendulum-v1")  # weights_only
    again = ALGOS[name](cfg.algo, PENDULUM, cfg.collector.total_frames)
    again.load_state_dict(state["algo"])
    for key, value in algo.obs_norm.state_dict().items():
        assert torch.equal(value, again.obs_norm.state_dict()[key]), key
    if name == "ppo":
        assert torch.equal(
            algo.reward_scaler.return_stats.var, again.reward_scaler.return_stats.var
        )
    policy, _, _ = load_policy(
        str(tmp_path), "Pendulum-v1"
    )  # what harness.cli.evaluate and write_dataset act with
    assert isinstance(policy, NormalizedPolicy) and torch.equal(
        policy.obs_norm.mean, algo.obs_norm.mean
    )


def two_trainers(rank: int, world: int) -> dict:
    """PPO with ``ddp_group``: each trainer learns from its own collector's round."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    try:
        # The algorithm, and with it DDP's reducer, is gone before the group is: see
        # ``harness.train.run_role``.
        return one_reduced_update(rank, dist.group.WORLD)
    finally:
        dist.destroy_process_group()


def one_reduced_update(rank: int, group) -> dict:
    torch.manual_seed(0)
    cfg = PPOConfig(normalize_obs=True, normalize_reward=True, update_epochs=1, num_minibatches=2)
    algo = ALGOS["ppo"](cfg, PENDULUM, 1000, group)
    batch = batch_template(algo.acting_policy(algo.published_models()), PENDULUM.obs_shape, 8, 2)
    batch["rollout", "obs"].copy_(stream(10 + rank, 16).float().view(8, 2, 3))
    batch["rollout", "reward"].copy_(
        torch.randn(8, 2, generator=torch.Generator().manual_seed(20 + rank))
    )
    algo.update([batch], 0)
    stats = {
        "mean": algo.obs_norm.mean,
        "var": algo.obs_norm.var,
        "count": algo.obs_norm.count,
        "return_var": algo.reward_scaler.return_stats.var,
        "actor": torch.cat([p.flatten() for p in algo.policy.parameters()]),
    }
    return {
        k: v.tolist() for k, v in stats.items()
    }  # plain values: tensors would not outlive this process


@pytest.mark.multiprocess
def test_trainers_reduce_the_statistics_like_gradients():
    results = run_ranks(two_trainers, 2, timeout=120)
    assert all(status == "ok" for status, _ in results.values()), results
    first, second = results[0][1], results[1][1]
    assert first == second  # every trainer holds the same statistics and the same weights
    union = torch.cat([stream(10, 16).float(), stream(11, 16).float()]).double()
    assert first["count"] == 32
    torch.testing.assert_close(torch.tensor(first["mean"], dtype=torch.float64), union.mean(0))
    torch.testing.assert_close(
        torch.tensor(first["var"], dtype=torch.float64), union.var(0, unbiased=False)
    )
