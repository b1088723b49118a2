"""Generalised advantage estimation (Schulman et al. 2016)."""

from __future__ import annotations

import torch

from harness.algos.scan import discounted_suffix_sum


def gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    done: torch.Tensor,
    next_value: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """Advantages for a ``[T, N]`` rollout, on the rollout's own device.

    ``done[t]`` is true when the episode ended with the action of step ``t``;
    ``value[t + 1]`` is then the next episode's first state and is masked out.
    ``next_value`` ``[N]`` is the value of the state after the last step.
    """
    nonterminal = 1.0 - done.to(reward.dtype)
    following = torch.cat([value[1:], next_value.unsqueeze(0)])  # V(x_{t+1})
    delta = reward + gamma * nonterminal * following - value
    return discounted_suffix_sum(delta, gamma * lam * nonterminal)
