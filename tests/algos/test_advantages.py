"""GAE and V-trace, computed by a doubling scan, against the papers' sums written out term by term
on random rollouts with episode ends (terminations and truncations) and bootstrap values."""

from __future__ import annotations

import pytest
import torch
from test_vtrace import paper_targets  # tests/algos/

from harness.algos.gae import gae
from harness.algos.scan import discounted_suffix_sum
from harness.algos.vtrace import vtrace

SHAPES = [(1, 1), (2, 3), (7, 2), (64, 4), (300, 3)]  # T below, at and off powers of two


def rollout(steps: int, envs: int, seed: int, dtype=torch.float64) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    terminated = torch.rand(steps, envs, generator=gen) < 0.05
    truncated = torch.rand(steps, envs, generator=gen) < 0.03
    return {
        "reward": torch.randn(steps, envs, generator=gen, dtype=dtype),
        "value": torch.randn(steps, envs, generator=gen, dtype=dtype),
        "done": terminated | truncated,
        "next_value": torch.randn(envs, generator=gen, dtype=dtype),
        "log_ratio": 0.5 * torch.randn(steps, envs, generator=gen, dtype=dtype),
    }


def schulman_advantages(reward, value, done, next_value, gamma, lam):
    """Eq. (16) of Schulman et al. 2016, for each step the sum of (gamma lambda)^l delta_{t+l} over
    the rest of its episode inside the rollout, with delta_t = r_t + gamma V(x_{t+1}) - V(x_t)
    (no bootstrap from a step that ended its episode)."""
    steps, envs = reward.shape
    advantages = torch.zeros_like(reward)
    for env in range(envs):
        values = torch.cat([value[:, env], next_value[env].reshape(1)])
        delta = [
            reward[t, env] + (0.0 if done[t, env] else gamma * values[t + 1]) - values[t]
            for t in range(steps)
        ]
        for t in range(steps):
            for ahead in range(steps - t):
                advantages[t, env] += (gamma * lam) ** ahead * delta[t + ahead]
                if done[t + ahead, env]:
                    break
    return advantages


@pytest.mark.unit
@pytest.mark.parametrize("steps,envs", SHAPES)
def test_gae_equals_the_papers_sum_over_each_episode(steps, envs):
    r = rollout(steps, envs, seed=steps)
    expected = schulman_advantages(r["reward"], r["value"], r["done"], r["next_value"], 0.99, 0.95)
    got = gae(r["reward"], r["value"], r["done"], r["next_value"], 0.99, 0.95)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.unit
@pytest.mark.parametrize("steps,envs", SHAPES)
def test_vtrace_with_episode_ends_equals_the_papers_sum_over_each_episode(steps, envs):
    """Each episode's piece of the segment is the paper's sum on its own, bootstrapping from the
    value after the segment where it runs on and from zero where it ended."""
    r, gamma, lam, rho_bar, c_bar = rollout(steps, envs, seed=steps + 1), 0.99, 0.9, 1.0, 0.8
    targets, advantages = vtrace(
        r["log_ratio"],
        r["reward"],
        r["value"],
        r["done"],
        r["next_value"],
        gamma,
        lam,
        rho_bar,
        c_bar,
    )
    for env in range(envs):
        ends = [t + 1 for t in range(steps) if r["done"][t, env]]
        for start, stop in zip([0, *ends], [*ends, steps]):
            if start == stop:
                continue
            ended = bool(r["done"][stop - 1, env])
            bootstrap = torch.zeros((), dtype=torch.float64) if ended else r["next_value"][env]
            piece = slice(start, stop)
            expected = paper_targets(
                r["log_ratio"][piece, env],
                r["reward"][piece, env],
                r["value"][piece, env],
                bootstrap,
                gamma,
                lam,
                rho_bar,
                c_bar,
            )
            torch.testing.assert_close(targets[piece, env], expected[0], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(advantages[piece, env], expected[1], rtol=1e-12, atol=1e-12)


@pytest.mark.unit
def test_the_scan_keeps_trailing_dimensions_and_stops_at_zero_discounts():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(37, 2, 3, generator=gen, dtype=torch.float64)
    discount = torch.rand(37, 2, 3, generator=gen, dtype=torch.float64)
    discount[10] = 0.0
    expected, following = torch.zeros_like(x), torch.zeros_like(x[0])
    for t in reversed(range(37)):  # the recurrence itself, one step at a time
        following = x[t] + discount[t] * following
        expected[t] = following
    got = discounted_suffix_sum(x, discount)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got[:11], discounted_suffix_sum(x[:11], discount[:11]))


@pytest.mark.unit
def test_float32_gae_over_a_long_rollout_stays_within_rounding_of_float64():
    r = rollout(4096, 8, seed=1)
    exact = gae(r["reward"], r["value"], r["done"], r["next_value"], 0.99, 0.95)
    single = {k: v.float() if v.is_floating_point() else v for k, v in r.items()}
    got = gae(single["reward"], single["value"], single["done"], single["next_value"], 0.99, 0.95)
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: GAE and V-trace on the GPU")
def test_gae_and_vtrace_on_the_gpu_equal_the_cpus_and_stay_there():
    r = rollout(2048, 16, seed=2)
    on_gpu = {k: v.cuda() for k, v in r.items()}
    args = ("reward", "value", "done", "next_value")
    got = gae(*(on_gpu[k] for k in args), 0.99, 0.95)
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), gae(*(r[k] for k in args), 0.99, 0.95))
    got_targets, _ = vtrace(on_gpu["log_ratio"], *(on_gpu[k] for k in args), 0.99, 0.9, 1.0, 0.8)
    expected_targets, _ = vtrace(r["log_ratio"], *(r[k] for k in args), 0.99, 0.9, 1.0, 0.8)
    torch.testing.assert_close(got_targets.cpu(), expected_targets)
