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
from torch.distributed import ProcessGroup

from harness.collect.envs import EnvSpec
from harness.packing import pack_parameters_


@dataclass
class AlgoConfig:
    """Fields every algorithm has."""

    name: str = MISSING  # registry key: ppo, ...
    compile: bool = False  # torch.compile the gradient step (docs/algorithms.md, "Update speed", says where it pays)


def require_actions(spec: EnvSpec, discrete: bool, message: str) -> None:
    """Refuse ``spec`` unless its actions are discrete (``discrete``) or continuous, with ``message``."""
    if spec.discrete != discrete:
        raise ValueError(message)


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
    # Attributes (loss methods, loss modules) that ``algo.compile`` replaces with their ``torch.compile``d selves:
    # the tensor maths of a step; optimiser steps stay eager (fused Adam is one kernel already).
    compiled: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: AlgoConfig, spec: EnvSpec, total_frames: int, ddp_group: ProcessGroup | None = None,
                 device: torch.device | str = "cpu"):
        self.cfg, self.spec, self.total_frames = cfg, spec, total_frames
        self.ddp_group = ddp_group  # the trainers' own group when there are several
        self.device = torch.device(device)  # where networks live and batches are moved to
        self.gradient_steps = 0  # optimiser steps of the main loss taken by this process
        # What collectors run (``make_policy``'s), trained here; packed before any optimiser sees it, so publishing is one copy.
        self.policy = pack_parameters_(self.make_policy(cfg, spec).to(self.device))
        if cfg.compile:  # compiled lazily, at the first call
            for name in self.compiled:
                setattr(self, name, torch.compile(getattr(self, name)))

    @classmethod
    def for_spec(cls, spec: EnvSpec) -> type[Algorithm]:
        """The class that learns on ``spec``'s action space: this one, unless a
        registry entry has a form per action space (``algo=cql``: discrete CQL
        for discrete actions). Build an algorithm with
        ``ALGOS[name].for_spec(spec)(cfg, spec, total_frames, ddp_group)``."""
        return cls

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

    def published_models(self) -> dict[str, nn.Module]:
        """The models whose weights travel to collectors, by name."""
        return {"policy": self.policy}

    @abc.abstractmethod
    def update(self, batches: list[TensorDict], frames: int) -> dict[str, torch.Tensor | float]:
        """Learn from one round of collectors' batches; ``frames`` counts env
        frames before them. Returns metrics named ``train/...``: detached
        tensors (or numbers), read with ``float()`` once per log row, so that
        no step waits for the device."""

    def values_for_header(self, frames: int) -> dict[str, float]:
        """The named floats that travel to collectors with the weights."""
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
