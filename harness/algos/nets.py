"""Network pieces shared by the algorithms."""

from __future__ import annotations

import math
from typing import Sequence

from torch import nn


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights and constant bias, as CleanRL initialises PPO."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(inputs: int, hidden: Sequence[int], outputs: int, activation: type[nn.Module] = nn.Tanh, out_std: float = 1.0) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [layer_init(nn.Linear(inputs, width)), activation()]
        inputs = width
    layers.append(layer_init(nn.Linear(inputs, outputs), std=out_std))
    return nn.Sequential(*layers)
