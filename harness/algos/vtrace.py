"""V-trace targets and advantages (Espeholt et al. 2018, IMPALA), for learning
from frames acted with an older policy than the one being trained.

With importance ratios ``rho_t = pi(a_t | x_t) / mu(a_t | x_t)`` (``pi`` the
learner's policy, ``mu`` the one that acted), truncated as
``rho_t = min(rho_bar, ratio)`` and ``c_t = lam * min(c_bar, ratio)``:

    v_s - V(x_s) = delta_s + gamma * c_s * (v_{s+1} - V(x_{s+1})),
    delta_s = rho_s * (r_s + gamma * V(x_{s+1}) - V(x_s)),

and the policy gradient's advantage is ``rho_s * (r_s + gamma * v_{s+1} - V(x_s))``.
On-policy (every ratio 1, ``rho_bar, c_bar >= 1``) the targets are GAE(lam)'s
returns and the advantages GAE(lam)'s with ``lam = 1``; harness/algos/gae.py.
"""

from __future__ import annotations

import torch

from harness.algos.scan import discounted_suffix_sum


def vtrace(
    log_ratio: torch.Tensor,
    reward: torch.Tensor,
    value: torch.Tensor,
    done: torch.Tensor,
    next_value: torch.Tensor,
    gamma: float,
    lam: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Value targets ``v_s`` and policy-gradient advantages for a ``[T, N]`` segment.

    ``log_ratio`` is ``log pi(a_t | x_t) - log mu(a_t | x_t)``; ``done``,
    ``value`` and ``next_value`` are as :func:`harness.algos.gae.gae` takes them
    (an episode's end stops every trace and bootstrap).
    """
    ratio = log_ratio.exp()
    rho, c = ratio.clamp(max=rho_bar), lam * ratio.clamp(max=c_bar)
    nonterminal = 1.0 - done.to(reward.dtype)
    # V(x_{t+1}), before masking episode ends
    following = torch.cat([value[1:], next_value.unsqueeze(0)])
    delta = rho * (reward + gamma * nonterminal * following - value)
    correction = discounted_suffix_sum(delta, gamma * c * nonterminal)  # v_s - V(x_s)
    targets = value + correction
    # v_{s+1}; past the segment, V bootstraps
    next_targets = torch.cat([targets[1:], next_value.unsqueeze(0)])
    advantage = rho * (reward + gamma * nonterminal * next_targets - value)
    return targets, advantage
