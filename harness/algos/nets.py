"""Network pieces shared by the algorithms: initialisation, MLPs, the action
box, and a learned positive coefficient."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from harness.specs import EnvSpec


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights and constant bias, as CleanRL initialises PPO."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(
    inputs: int, hidden: Sequence[int], outputs: int, activation: type[nn.Module] = nn.Tanh, out_std: float = 1.0
) -> nn.Sequential:
    """Linear layers of widths ``hidden`` with ``activation`` between them, each ``layer_init``-ed."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [layer_init(nn.Linear(inputs, width)), activation()]
        inputs = width
    layers.append(layer_init(nn.Linear(inputs, outputs), std=out_std))
    return nn.Sequential(*layers)


class Bounds(nn.Module):
    """The action box as buffers: ``low + (tanh(u) + 1) / 2 * (high - low)``."""

    scale: torch.Tensor  # buffers, registered in __init__
    bias: torch.Tensor

    def __init__(self, spec: EnvSpec):
        super().__init__()
        low, high = torch.tensor(spec.action_low), torch.tensor(spec.action_high)
        self.register_buffer("scale", (high - low) / 2)
        self.register_buffer("bias", (high + low) / 2)

    def random(self, n: int) -> torch.Tensor:
        """``n`` actions drawn uniformly from the box."""
        return self.bias + self.scale * (2 * torch.rand(n, self.scale.numel(), device=self.scale.device) - 1)

    def clamp(self, action: torch.Tensor) -> torch.Tensor:
        """``action`` clipped into the box."""
        return torch.max(torch.min(action, self.bias + self.scale), self.bias - self.scale)


class LogScalar(nn.Module):
    """A positive coefficient learned through its logarithm (SAC's entropy
    weight alpha, CQL's Lagrange multiplier): ``forward()`` is ``exp(log_value)``."""

    def __init__(self, initial: float = 1.0):
        super().__init__()
        self.log_value = nn.Parameter(torch.tensor(math.log(initial)))

    def forward(self) -> torch.Tensor:
        return self.log_value.exp()
