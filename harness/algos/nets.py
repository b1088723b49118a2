"""Network pieces shared by the algorithms: initialisation, MLPs, the CNNs
that image observations go through, the action box, and a learned positive
coefficient."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import torch
from torch import nn

from harness.core.specs import EnvSpec

Layer = TypeVar("Layer", nn.Linear, nn.Conv2d)


def layer_init(layer: Layer, std: float = math.sqrt(2), bias: float = 0.0) -> Layer:
    """Orthogonal weights and constant bias, as CleanRL initialises PPO (and its Atari CNN)."""
    nn.init.orthogonal_(layer.weight, std)
    assert layer.bias is not None  # every layer here has one
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(
    inputs: int,
    hidden: Sequence[int],
    outputs: int,
    activation: type[nn.Module] = nn.Tanh,
    out_std: float = 1.0,
) -> nn.Sequential:
    """Linear layers of widths ``hidden`` with ``activation`` between them, each
    ``layer_init``-ed."""
    layers = hidden_layers(inputs, hidden, activation)
    layers.append(layer_init(nn.Linear(hidden[-1] if hidden else inputs, outputs), std=out_std))
    return nn.Sequential(*layers)


def hidden_layers(
    inputs: int, hidden: Sequence[int], activation: type[nn.Module] = nn.Tanh
) -> list[nn.Module]:
    """An MLP's hidden part: a ``layer_init``-ed linear layer of each width in ``hidden``, each
    followed by ``activation``."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [layer_init(nn.Linear(inputs, width)), activation()]
        inputs = width
    return layers


class PixelEncoder(nn.Module):
    """uint8 images ``[..., C*H*W]`` (flattened, as every network's input is) to features ``[...,
    features]``: made float and scaled to [0, 1] here, on the network's device, so batches travel as
    bytes.

    Chosen by the image's size: from 36 pixels up, the Nature CNN (Mnih et al. 2015; CleanRL's Atari
    ``Agent``: convolutions 8x8/4, 4x4/2, 3x3/1 and 512 units); smaller (MinAtar's 10x10), MinAtar's
    network (Young and Tian 2019: one 3x3 convolution of 16 channels and 128 units), where the
    Nature CNN's strides leave nothing."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        channels, height, width = shape
        self.shape = shape
        if min(height, width) >= 36:
            convs: list[nn.Module] = [
                layer_init(nn.Conv2d(channels, 32, 8, stride=4)),
                nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)),
                nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)),
                nn.ReLU(),
            ]
            self.features = 512
        else:
            convs, self.features = (
                [layer_init(nn.Conv2d(channels, 16, 3, stride=1)), nn.ReLU()],
                128,
            )
        self.convs = nn.Sequential(*convs, nn.Flatten())
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, *shape)).shape[-1]
        self.linear = nn.Sequential(layer_init(nn.Linear(flat, self.features)), nn.ReLU())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        lead = obs.shape[:-1]
        images = obs.reshape(-1, *self.shape).float() / 255.0
        return self.linear(self.convs(images)).view(*lead, self.features)


def network(
    spec: EnvSpec,
    hidden: Sequence[int],
    outputs: int,
    activation: type[nn.Module] = nn.Tanh,
    out_std: float = 1.0,
) -> nn.Sequential:
    """An observation's network to ``outputs``: :func:`mlp` on state vectors (``hidden`` wide), and
    on images a :class:`PixelEncoder` with one linear layer on top (CleanRL's heads; ``hidden`` is
    the MLP's alone)."""
    if not spec.pixels:
        return mlp(spec.obs_dim, hidden, outputs, activation, out_std)
    encoder = PixelEncoder(spec.obs_shape)
    return nn.Sequential(encoder, layer_init(nn.Linear(encoder.features, outputs), std=out_std))


def encoder(
    spec: EnvSpec, hidden: Sequence[int], activation: type[nn.Module] = nn.Tanh
) -> tuple[nn.Module, int]:
    """An observation's features and their width, for a recurrent core to read
    (:mod:`harness.algos.memory`): on images a :class:`PixelEncoder`, on state vectors
    :func:`hidden_layers` (none with ``hidden`` empty: the observation itself)."""
    if spec.pixels:
        pixels = PixelEncoder(spec.obs_shape)
        return pixels, pixels.features
    layers = hidden_layers(spec.obs_dim, hidden, activation)
    return nn.Sequential(*layers), hidden[-1] if hidden else spec.obs_dim


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
        return self.bias + self.scale * (
            2 * torch.rand(n, self.scale.numel(), device=self.scale.device) - 1
        )

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
