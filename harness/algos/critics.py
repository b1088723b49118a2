"""Q-networks ``Q_i(s, a)`` with Polyak-averaged targets, shared by SAC, TD3,
IQL and CQL; and the Polyak update every target network uses.

``Critics(spec, hidden)`` holds ``members`` critics (two: clipped double Q)
of CleanRL's shape, ``obs + action -> hidden -> hidden -> 1`` with ReLU, and
a target copy of each. Values come stacked, ``[members, *batch]``: the
algorithm takes the minimum or the sum over the first dimension itself.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from harness.algos.nets import mlp
from harness.collect.envs import EnvSpec


def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """Polyak averaging: ``target <- tau * source + (1 - tau) * target``."""
    with torch.no_grad():
        for t, s in zip(target.parameters(), source.parameters()):
            t.lerp_(s, tau)


def critic_metrics(q: torch.Tensor, q_loss: torch.Tensor) -> dict[str, float]:
    """``train/q_loss`` and each critic's mean value on the batch, ``train/q1``, ``train/q2``, ..."""
    return {"train/q_loss": q_loss.item(), **{f"train/q{i + 1}": q_i.mean().item() for i, q_i in enumerate(q)}}


class Critics(nn.Module):
    """``members`` Q-networks and their targets; ``online`` is what an optimiser trains."""

    def __init__(self, spec: EnvSpec, hidden: int, members: int = 2):
        super().__init__()
        self.online = nn.ModuleList(mlp(spec.obs_dim + spec.num_actions, [hidden, hidden], 1, activation=nn.ReLU) for _ in range(members))
        self.target = copy.deepcopy(self.online).requires_grad_(False)

    @staticmethod
    def inputs(obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``[obs, action]`` rows: ``obs`` ``[B, ...]`` with ``action`` ``[B, A]``
        or ``[B, N, A]`` (N actions per observation)."""
        obs = obs.flatten(1)
        if action.dim() == 3:
            obs = obs.unsqueeze(1).expand(-1, action.shape[1], -1)
        return torch.cat([obs, action], -1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor, members: int | None = None) -> torch.Tensor:
        """``Q_i(s, a)`` of the first ``members`` critics (default: all): ``[members, B]`` or ``[members, B, N]``."""
        x = self.inputs(obs, action)
        return torch.stack([q(x).squeeze(-1) for q in self.online[:members]])

    def targets(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``Q'_i(s, a)`` of every target critic, without gradient."""
        with torch.no_grad():
            x = self.inputs(obs, action)
            return torch.stack([q(x).squeeze(-1) for q in self.target])

    def update_targets(self, tau: float) -> None:
        """Polyak-average the targets towards the critics."""
        soft_update(self.target, self.online, tau)
