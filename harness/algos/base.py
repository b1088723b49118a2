"""What every algorithm provides to the harness.

An algorithm is one file: a config dataclass, the policy module that collectors
act with (its weights are what the sync scheme publishes), and the trainer-side
``update`` that learns from collectors' batches.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar, Mapping

import torch
from omegaconf import MISSING
from tensordict import TensorDict
from torch import nn

from harness.collect.envs import EnvSpec


@dataclass
class AlgoConfig:
    """Fields every algorithm has."""

    name: str = MISSING  # registry key: ppo, ...


class Policy(nn.Module, abc.ABC):
    """The module a collector runs. ``forward`` maps a batch of observations to
    a TensorDict holding ``action`` and whatever else the algorithm needs per
    frame (PPO: ``logprob``); every field is stored in the batch. ``values``
    are the header's named floats (DQN's epsilon); ``deterministic`` asks for
    the evaluation action (the mode, no exploration noise)."""

    @abc.abstractmethod
    def forward(self, obs: torch.Tensor, values: Mapping[str, float] = {}, deterministic: bool = False) -> TensorDict: ...


class Algorithm(abc.ABC):
    """Trainer-side half: networks, optimisers and the update."""

    Config: ClassVar[type[AlgoConfig]]
    # Named floats sent to collectors with every publish (DQN: epsilon).
    header_values: ClassVar[tuple[str, ...]] = ()
    # Store each frame's next observation in batches (replay-based algorithms).
    needs_next_obs: ClassVar[bool] = False
    # Learns from a fixed dataset, not from collectors' frames (harness/algos/offline.py).
    offline: ClassVar[bool] = False
    # Averages gradients over several trainers (topology.trainers > 1) with ``data_parallel``.
    data_parallel_trainers: ClassVar[bool] = False

    def __init__(self, cfg: AlgoConfig, spec: EnvSpec, total_frames: int, ddp_group=None):
        self.cfg, self.spec, self.total_frames = cfg, spec, total_frames
        self.ddp_group = ddp_group  # the trainers' own group when there are several

    def data_parallel(self, module: nn.Module) -> nn.Module:
        """``module`` wrapped in DDP over the trainers' group (gradients are
        averaged across trainers), or as it is with one trainer."""
        if self.ddp_group is None:
            return module
        return nn.parallel.DistributedDataParallel(module, process_group=self.ddp_group)

    @classmethod
    @abc.abstractmethod
    def make_policy(cls, cfg: AlgoConfig, spec: EnvSpec) -> Policy:
        """The collectors' module; trainers build the same one and train it."""

    @abc.abstractmethod
    def published_models(self) -> dict[str, nn.Module]:
        """The models whose weights travel to collectors, by name."""

    @abc.abstractmethod
    def update(self, batches: list[TensorDict], frames: int) -> dict[str, float]:
        """Learn from one round of collectors' batches; ``frames`` counts env
        frames before them. Returns metrics named ``train/...``."""

    def values_for_header(self, frames: int) -> dict[str, float]:
        return {}

    @abc.abstractmethod
    def checkpointed(self) -> dict[str, object]:
        """Everything with a ``state_dict`` that a checkpoint must hold: models
        (unwrapped from DDP) and optimisers, by name."""

    def state_dict(self) -> dict:
        return {name: obj.state_dict() for name, obj in self.checkpointed().items()}

    def load_state_dict(self, state: dict) -> None:
        for name, obj in self.checkpointed().items():
            obj.load_state_dict(state[name])
