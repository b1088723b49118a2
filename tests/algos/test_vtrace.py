"""V-trace against a direct transcription of the IMPALA paper's sum, and against GAE on on-policy
data."""

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
    targets, advantage = vtrace(
        log_ratio, reward, value, done, next_value, 0.97, lam, rho_bar, c_bar
    )
    expected_targets, expected_advantage = paper_targets(
        log_ratio[:, 0], reward[:, 0], value[:, 0], next_value, 0.97, lam, rho_bar, c_bar
    )
    torch.testing.assert_close(targets[:, 0], expected_targets)
    torch.testing.assert_close(advantage[:, 0], expected_advantage)


def test_on_policy_vtrace_is_gae_with_episode_ends():
    """Every ratio 1: the targets are GAE(lam)'s returns (advantage + V); the advantages GAE(1)'s
    one-step form ``r + gamma v_{s+1} - V`` equals GAE(lam=1) when lam = 1. Episode ends stop both
    the same way."""
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
        targets, advantage = vtrace(
            torch.full((1, 1), ratio).log(), reward, value, done, next_value, 0.9
        )
        assert targets.item() == pytest.approx(expected)
        assert advantage.item() == pytest.approx(expected)


def ppo_with(vtrace_on: bool, rho_bar: float = 1.0):
    from harness.algos import algorithm_for
    from harness.collect.envs import env_spec

    spec = env_spec("CartPole-v1")
    cls = algorithm_for("ppo", spec)
    torch.manual_seed(0)
    return cls(
        cls.Config(compile=False, vtrace=vtrace_on, vtrace_rho_bar=rho_bar, gae_lambda=0.9),
        spec,
        10_000,
    )


def acted(ppo, steps: int = 12, envs: int = 3, lag_shift: float = 0.0):
    """A ``[steps, envs]`` rollout whose recorded log-probs are ``ppo``'s own (on-policy), shifted
    by ``lag_shift``."""
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(1)
    obs = torch.randn(steps, envs, 4, generator=g)
    action = torch.randint(0, 2, (steps, envs), generator=g)
    logprob = (
        ppo.policy.log_prob_entropy(obs.flatten(0, 1), action.flatten())[0]
        .detach()
        .view(steps, envs)
        + lag_shift
    )
    rollout = TensorDict(
        obs=obs,
        action=action,
        logprob=logprob,
        reward=torch.rand(steps, envs, generator=g),
        batch_size=[steps, envs],
    )
    rollout["done"] = torch.rand(steps, envs, generator=g) < 0.15
    return obs, rollout, torch.randn(envs, 4, generator=g)


def test_ppo_on_policy_vtrace_targets_are_gae_returns():
    """PPO's own update, lag 0: V-trace's value targets equal GAE(lambda)'s returns, and nothing is
    truncated."""
    with_vtrace, with_gae = ppo_with(True), ppo_with(False)
    obs, rollout, next_obs = acted(with_vtrace)
    values, _, returns, clipped = with_vtrace.targets(obs, rollout, rollout["reward"], next_obs)
    gae_values, _, gae_returns, _ = with_gae.targets(obs, rollout, rollout["reward"], next_obs)
    assert torch.allclose(values, gae_values)
    assert torch.allclose(returns, gae_returns, atol=1e-5)
    assert float(clipped) == 0.0


def test_ppo_vtrace_weights_frames_by_their_ratio_truncated_at_rho_bar():
    """Frames the learner now prefers (ratio e^0.5) are truncated to ratio 1 at rho_bar = 1, which
    leaves GAE's targets; frames it now avoids (ratio e^-0.5), or the preferred ones under rho_bar =
    2, move the targets off."""

    def targets(shift: float, rho_bar: float = 1.0) -> tuple[torch.Tensor, float]:
        ppo = ppo_with(True, rho_bar)
        obs, rollout, next_obs = acted(ppo, lag_shift=shift)
        _, _, returns, clipped = ppo.targets(obs, rollout, rollout["reward"], next_obs)
        return returns, float(clipped)

    ppo = ppo_with(False)
    obs, rollout, next_obs = acted(ppo)
    gae_returns = ppo.targets(obs, rollout, rollout["reward"], next_obs)[2]
    preferred, clipped = targets(-0.5)
    assert clipped == 1.0 and torch.allclose(preferred, gae_returns, atol=1e-5)
    for shift, rho_bar in ((0.5, 1.0), (-0.5, 2.0)):
        returns, clipped = targets(shift, rho_bar)
        assert clipped == 0.0 and not torch.allclose(returns, gae_returns, atol=1e-3), (
            shift,
            rho_bar,
        )
