"""Q-networks ``Q_i(s, a)`` with Polyak-averaged targets, shared by SAC, TD3,
IQL and CQL; and the Polyak update every target network uses.

``Critics(spec, hidden)`` holds ``members`` critics (two: clipped double Q) of
CleanRL's shape, ``obs + action -> hidden -> hidden -> 1`` with ReLU, as one
``Ensemble``: each layer's weights stacked ``[members, in, out]`` and applied to
every member at once with one ``torch.baddbmm``. Values come stacked,
``[members, *batch]``: the algorithm takes the minimum or the sum over the
first dimension itself. Targets are updated with one fused ``lerp``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from harness.algos.nets import mlp
from harness.core.specs import EnvSpec


def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """Polyak averaging, ``target <- tau * source + (1 - tau) * target``, for every parameter in one
    fused call."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


def critic_metrics(q: torch.Tensor, q_loss: torch.Tensor) -> dict[str, torch.Tensor]:
    """``train/q_loss`` and each critic's mean value on the batch, ``train/q1``, ``train/q2``, ...
    (tensors: read once per log row, not once per step)."""
    means = q.detach().flatten(1).mean(1)
    return {
        "train/q_loss": q_loss.detach(),
        **{f"train/q{i + 1}": mean for i, mean in enumerate(means)},
    }


# On a CPU, rows per batched call: CQL's 7,936 (256 observations x 31 actions) in one call took 122
# ms forward and backward, in blocks of 1,024 rows 101 ms (one thread, 2026-12-01).
CPU_ROWS = 1024


class Ensemble(nn.Module):
    """MLPs of the same widths (ReLU between layers) as one module: layer ``i``
    of every member in ``weight[i]`` ``[members, in, out]`` and ``bias[i]``
    ``[members, 1, out]``, initialised as the given ``nets``."""

    def __init__(self, nets: Sequence[nn.Sequential]):
        super().__init__()
        layers = zip(*([m for m in net if isinstance(m, nn.Linear)] for net in nets))
        weights, biases = [], []
        for linears in layers:  # layer by layer, every member's copy of it
            weights.append(
                nn.Parameter(torch.stack([linear.weight.detach().T for linear in linears]))
            )
            biases.append(
                nn.Parameter(torch.stack([linear.bias.detach()[None] for linear in linears]))
            )
        self.weight, self.bias = nn.ParameterList(weights), nn.ParameterList(biases)

    def forward(
        self, x: torch.Tensor, members: int | None = None, frozen: bool = False
    ) -> torch.Tensor:
        """The first ``members`` members (default: all) on ``x`` ``[M, in]``: ``[members, M, out]``.
        ``frozen``: no gradient for the weights (it still flows to ``x``)."""
        members = members or self.weight[0].shape[0]
        # in blocks whose activations stay in cache
        if x.device.type == "cpu" and x.shape[0] > CPU_ROWS:
            return torch.cat(
                [self.forward(block, members, frozen) for block in x.split(CPU_ROWS)], 1
            )
        h = x.expand(members, *x.shape)
        for i, (w, b) in enumerate(zip(self.weight, self.bias)):
            w, b = w[:members], b[:members]
            if frozen:
                w, b = w.detach(), b.detach()
            h = torch.baddbmm(b, h, w)
            if i < len(self.weight) - 1:
                h = torch.relu(h)
        # float32 values under algo.amp too: TD targets and their errors need the precision
        return h.float()


class Critics(nn.Module):
    """``members`` Q-networks and their targets; ``online`` is what an optimiser trains."""

    def __init__(self, spec: EnvSpec, hidden: int, members: int = 2):
        super().__init__()
        # Built as separate nets first, so that each member is initialised as one critic alone would
        # be.
        nets = [
            mlp(spec.obs_dim + spec.num_actions, [hidden, hidden], 1, activation=nn.ReLU)
            for _ in range(members)
        ]
        self.online = Ensemble(nets)
        self.target = copy.deepcopy(self.online).requires_grad_(False)

    @staticmethod
    def inputs(obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``[obs, action]`` rows: ``obs`` ``[B, ...]`` with ``action`` ``[B, A]``
        or ``[B, N, A]`` (N actions per observation)."""
        obs = obs.flatten(1)
        if action.dim() == 3:
            obs = obs.unsqueeze(1).expand(-1, action.shape[1], -1)
        return torch.cat([obs, action], -1)

    @staticmethod
    def _evaluate(
        net: Ensemble,
        obs: torch.Tensor,
        action: torch.Tensor,
        members: int | None = None,
        frozen: bool = False,
    ) -> torch.Tensor:
        x = Critics.inputs(obs, action)
        q = net(x.reshape(-1, x.shape[-1]), members, frozen)
        return q.view(q.shape[0], *x.shape[:-1])

    def forward(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        members: int | None = None,
        frozen: bool = False,
    ) -> torch.Tensor:
        """``Q_i(s, a)`` of the first ``members`` critics (default: all), ``[members, B]`` or
        ``[members, B, N]``; ``frozen``: the gradient reaches ``action`` but not the critics."""
        return self._evaluate(self.online, obs, action, members, frozen)

    def targets(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``Q'_i(s, a)`` of every target critic, without gradient."""
        with torch.no_grad():
            return self._evaluate(self.target, obs, action)

    def update_targets(self, tau: float) -> None:
        """Polyak-average the targets towards the critics."""
        soft_update(self.target, self.online, tau)
