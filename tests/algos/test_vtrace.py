"""V-trace against a direct transcription of the IMPALA paper's sum, and against GAE on on-policy data."""

from __future__ import annotations

import pytest
import torch

from harness.algos.gae import gae
from harness.algos.vtrace import vtrace

pytestmark = pytest.mark.unit


def paper_targets(log_ratio, reward, value, next_value, gamma, lam, rho_bar, c_bar):
    """Eq. (1) of Espeholt et al. 2018, summed term by term for one env without episode ends:
    v_s = V(x_s) + sum_{t>=s} gamma^(t-s) (prod_{i=s}^{t-1} c_i) delta_t."""
    ratio = log_ratio.exp()
    rho, c = ratio.clamp(max=rho_bar), lam * ratio.clamp(max=c_bar)
    values = torch.cat([value, next_value.reshape(1)])
    steps = reward.shape[0]
    delta = [rho[t] * (reward[t] + gamma * values[t + 1] - values[t]) for t in range(steps)]
    targets = []
    for s in range(steps):
        total, trace = values[s], torch.tensor(1.0, dtype=torch.float64)
        for t in range(s, steps):
            total = total + gamma ** (t - s) * trace * delta[t]
            trace = trace * c[t]
        targets.append(total)
    targets = torch.stack(targets)
    next_targets = torch.cat([targets[1:], next_value.reshape(1)])
    return targets, rho * (reward + gamma * next_targets - value)


@pytest.mark.parametrize("rho_bar,c_bar,lam", [(1.0, 1.0, 1.0), (2.0, 0.5, 0.9), (0.8, 1.0, 1.0)])
def test_vtrace_matches_the_papers_sum_off_policy(rho_bar, c_bar, lam):
    g = torch.Generator().manual_seed(0)
    steps = 12
    log_ratio = torch.randn(steps, 1, generator=g, dtype=torch.float64) * 0.7
    reward, value = (
        torch.randn(steps, 1, generator=g, dtype=torch.float64),
        torch.randn(steps, 1, generator=g, dtype=torch.float64),
    )
    next_value = torch.randn(1, generator=g, dtype=torch.float64)
    done = torch.zeros(steps, 1, dtype=torch.bool)
    targets, advantage = vtrace(log_ratio, reward, value, done, next_value, 0.97, lam, rho_bar, c_bar)
    expected_targets, expected_advantage = paper_targets(
        log_ratio[:, 0], reward[:, 0], value[:, 0], next_value, 0.97, lam, rho_bar, c_bar
    )
    torch.testing.assert_close(targets[:, 0], expected_targets)
    torch.testing.assert_close(advantage[:, 0], expected_advantage)


def test_on_policy_vtrace_is_gae_with_episode_ends():
    """Every ratio 1: the targets are GAE(lam)'s returns (advantage + V); the advantages GAE(1)'s one-step form
    ``r + gamma v_{s+1} - V`` equals GAE(lam=1) when lam = 1. Episode ends stop both the same way."""
    g = torch.Generator().manual_seed(1)
    steps, envs = 16, 3
    reward, value = torch.randn(steps, envs, generator=g), torch.randn(steps, envs, generator=g)
    next_value = torch.randn(envs, generator=g)
    done = torch.rand(steps, envs, generator=g) < 0.2
    zero = torch.zeros(steps, envs)
    for lam in (0.95, 1.0):
        targets, advantage = vtrace(zero, reward, value, done, next_value, 0.99, lam)
        torch.testing.assert_close(targets, gae(reward, value, done, next_value, 0.99, lam) + value)
    torch.testing.assert_close(advantage, gae(reward, value, done, next_value, 0.99, 1.0))


def test_truncation_levels_clip_large_ratios_only():
    """A ratio above rho_bar counts as rho_bar in delta and the advantage; below it, as itself."""
    reward, value, next_value = torch.ones(1, 1), torch.zeros(1, 1), torch.zeros(1)
    done = torch.zeros(1, 1, dtype=torch.bool)
    for ratio, expected in ((5.0, 1.0), (0.25, 0.25)):
        targets, advantage = vtrace(torch.full((1, 1), ratio).log(), reward, value, done, next_value, 0.9)
        assert targets.item() == pytest.approx(expected)
        assert advantage.item() == pytest.approx(expected)
