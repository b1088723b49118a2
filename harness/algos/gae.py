"""Generalised advantage estimation (Schulman et al. 2016)."""

from __future__ import annotations

import torch


def gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    done: torch.Tensor,
    next_value: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """Advantages for a ``[T, N]`` rollout.

    ``done[t]`` is true when the episode ended with the action of step ``t``;
    ``value[t + 1]`` is then the next episode's first state and is masked out.
    ``next_value`` ``[N]`` is the value of the state after the last step.

    On a GPU the loop runs on the CPU: its T steps are about six tiny kernels
    each (T = 2048 for ``ppo_halfcheetah``: some 12k launches an update),
    where the CPU does each step's arithmetic in microseconds.
    """
    if reward.is_cuda:
        on_host = gae(reward.cpu(), value.cpu(), done.cpu(), next_value.cpu(), gamma, lam)
        return on_host.to(reward.device, non_blocking=True)
    advantages = torch.zeros_like(reward)
    last = torch.zeros_like(next_value)
    for t in reversed(range(reward.shape[0])):
        following = next_value if t == reward.shape[0] - 1 else value[t + 1]
        nonterminal = 1.0 - done[t].float()
        delta = reward[t] + gamma * following * nonterminal - value[t]
        last = delta + gamma * lam * nonterminal * last
        advantages[t] = last
    return advantages
