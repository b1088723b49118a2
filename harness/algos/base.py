"""What every algorithm provides to the harness.

An algorithm is one file: a config dataclass, the policy module that collectors
act with (its weights are what the sync scheme publishes), and the trainer-side
``update`` that learns from collectors' batches.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Optional, Protocol, TypeVar, cast

import torch
import torch.distributed as dist
from omegaconf import MISSING
from tensordict import TensorDict
from torch import nn
from torch.distributed import ProcessGroup

from harness.algos.normalize import ObsNormalizer
from harness.algos.ranges import POSITIVE, check_ranges, ranged
from harness.algos.transfer import HostToDevice
from harness.core import quick_import
from harness.core.packing import pack_parameters_
from harness.core.specs import EnvSpec


@dataclass
class AlgoConfig:
    """Fields every algorithm has. Subclasses that add checks call ``super().__post_init__()``."""

    name: str = MISSING  # registry key: ppo, ...
    # torch.compile the gradient step; null: where it measured faster (continuous CQL;
    # docs/algorithms.md, "Update speed").
    compile: Optional[bool] = None
    # off | bf16: the update's forward passes in bfloat16 (torch.autocast); docs/gpu.md has the
    # measurements
    amp: str = "off"
    # Normalise observations by running statistics that trainers update and publish with the policy
    # (algos/normalize.py).
    normalize_obs: bool = False
    # Normalised observations are clipped to [-obs_clip, obs_clip] (CleanRL: 10).
    obs_clip: float = ranged(10.0, POSITIVE)

    def __post_init__(self) -> None:
        if self.amp not in AMP_DTYPES:
            raise ValueError(
                f"algo.amp={self.amp!r}: choose off (float32) or bf16 (autocast to bfloat16)"
            )
        check_ranges(self, "algo", f"algo={self.name}")  # every field's declared range (``ranged``)


AMP_DTYPES = {"off": None, "bf16": torch.bfloat16}


def require_actions(spec: EnvSpec, discrete: bool, message: str) -> None:
    """Refuse ``spec`` unless its actions are discrete (``discrete``) or continuous, with
    ``message``."""
    if spec.discrete != discrete:
        raise ValueError(message)


class Policy(nn.Module, abc.ABC):
    """The module a collector runs. ``forward`` maps a batch of observations to
    a TensorDict holding ``action`` and whatever else the algorithm needs per
    frame (PPO: ``logprob``); every field is stored in the batch. ``values``
    are the header's named floats (DQN's epsilon); ``deterministic`` asks for
    the evaluation action (the mode, no exploration noise)."""

    @abc.abstractmethod
    def forward(
        self, obs: torch.Tensor, values: Mapping[str, float] = {}, deterministic: bool = False
    ) -> TensorDict: ...

    def act(
        self,
        obs: torch.Tensor,
        values: Mapping[str, float] = {},
        deterministic: bool = False,
        **state: torch.Tensor,
    ) -> TensorDict:
        """``forward`` for CPU observations, wherever the weights are: with
        ``sync=nccl`` a collector's policy views a buffer on its GPU, so the
        observations go there once per step and the outputs come back once.
        ``state``: a policy with memory's input besides the observations
        (:mod:`harness.algos.memory`), passed on as keywords."""
        return self.actor()(obs, values, deterministic, **state)

    def actor(self) -> Callable[..., TensorDict]:
        """``act`` for as long as the weights stay on their device (a batch of
        steps: weights are applied in place, never moved): the module itself
        when they are on the CPU, so that a step pays for no device check."""
        weight = next(self.parameters(), None)  # None: a policy without weights (random actions)
        if weight is None or weight.device.type == "cpu":
            return self
        device = weight.device

        def on_device(
            obs: torch.Tensor,
            values: Mapping[str, float] = {},
            deterministic: bool = False,
            **state: torch.Tensor,
        ) -> TensorDict:
            moved = {k: v.to(device, non_blocking=True) for k, v in state.items()}
            return self(obs.to(device, non_blocking=True), values, deterministic, **moved).to("cpu")

        return on_device


class NormalizedPolicy(Policy):
    """``policy`` acting on observations normalised by ``obs_norm``: what a
    collector steps its envs with when the algorithm normalises. Both are
    models of the same payload, so the statistics are always the ones the
    policy's version was trained with; a collector never updates them."""

    def __init__(self, policy: Policy, obs_norm: ObsNormalizer):
        super().__init__()
        self.policy, self.obs_norm = policy, obs_norm

    def forward(
        self,
        obs: torch.Tensor,
        values: Mapping[str, float] = {},
        deterministic: bool = False,
        **state: torch.Tensor,
    ) -> TensorDict:
        return self.policy(self.obs_norm(obs), values, deterministic, **state)


# Statistics, not weights (checkpoint.init_with's "normalizer"): ``Algorithm.stateful``'s
# observation normaliser and PPO's reward scaler.
NORMALIZERS = ("obs_norm", "reward_scaler")


def part_of(name: str, value: Any) -> str:
    """What an entry of an algorithm's ``state_dict`` is: an ``optimizer``'s state, a
    ``normalizer``'s statistics, a network's ``weights``, or a ``counter`` (``gradient_steps``)."""
    if isinstance(value, dict) and {"state", "param_groups"} <= value.keys():
        return "optimizer"
    if name in NORMALIZERS:
        return "normalizer"
    return "weights" if isinstance(value, dict) else "counter"


class Stateful(Protocol):
    """What a checkpoint holds: a module or an optimiser, by its ``state_dict``."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


ConfigT = TypeVar("ConfigT", bound=AlgoConfig)
PolicyT = TypeVar("PolicyT", bound=Policy)


class Algorithm(abc.ABC, Generic[ConfigT, PolicyT]):
    """Trainer-side half: networks, optimisers and the update. Parameterised
    by its config dataclass and the policy it trains, so that ``self.cfg``
    and ``self.policy`` have their algorithm's types."""

    Config: ClassVar[type[AlgoConfig]]
    cfg: ConfigT
    policy: PolicyT
    # Named floats sent to collectors with every publish (DQN: epsilon).
    header_values: ClassVar[tuple[str, ...]] = ()
    # Store each frame's next observation in batches (replay-based algorithms).
    needs_next_obs: ClassVar[bool] = False
    # Learns from a fixed dataset, not from collectors' frames (harness/algos/offline.py).
    offline: ClassVar[bool] = False
    # Learns from each frame in the update it arrives for, not from a replay: an async update takes
    # a round's frames (one batch per collector of the trainer, whichever come first), as a sync one
    # does.
    on_policy: ClassVar[bool] = False
    # Its networks take image observations (harness.algos.nets.network: a CNN chosen by the image's
    # shape).
    takes_pixels: ClassVar[bool] = False
    # Averages gradients over several trainers (topology.trainers > 1): with ``data_parallel`` (DDP)
    # when the loss is one module's forward, else with ``optim.step(..., self.ddp_group)`` per
    # optimiser step.
    data_parallel_trainers: ClassVar[bool] = False
    # Attributes (loss methods, loss modules) that ``algo.compile`` replaces with their
    # ``torch.compile``d selves: the tensor maths of a step; optimiser steps stay eager (fused Adam
    # is one kernel already).
    compiled: ClassVar[tuple[str, ...]] = ()
    # What ``algo.compile=null`` means: compiled only where that measured faster, compile time
    # counted.
    compile_by_default: ClassVar[bool] = False

    def __init__(
        self,
        cfg: ConfigT,
        spec: EnvSpec,
        total_frames: int,
        ddp_group: ProcessGroup | None = None,
        device: torch.device | str = "cpu",
    ):
        self.cfg, self.spec, self.total_frames = cfg, spec, total_frames
        self.ddp_group = ddp_group  # the trainers' own group when there are several
        self.device = torch.device(device)  # where networks live and batches are moved to
        self.to_device = HostToDevice(self.device)  # each update's batch, once, via pinned memory
        self.amp_dtype = AMP_DTYPES[cfg.amp]
        self.gradient_steps = 0  # optimiser steps of the main loss taken by this process
        # What collectors run (``make_models``'), trained here; packed into one buffer before any
        # optimiser sees it, so that publishing is one copy.
        self.models = {
            name: model.to(self.device) for name, model in self.make_models(cfg, spec).items()
        }
        pack_parameters_(nn.ModuleDict(self.models))
        self.policy = cast(PolicyT, self.models["policy"])
        # Updated by ``update``, from raw frames.
        self.obs_norm = cast(Optional[ObsNormalizer], self.models.get("obs_norm"))
        # Compiled lazily, at the first call.
        if self.compile_by_default if cfg.compile is None else cfg.compile:
            quick_import.mark_for_compile()
            for name in self.compiled:
                setattr(self, name, torch.compile(getattr(self, name)))

    def autocast(self) -> contextlib.AbstractContextManager:
        """Where an update computes its losses: under ``torch.autocast`` to
        ``algo.amp``'s dtype when it is on (matrix products in bfloat16,
        reductions in float32; backward and optimiser steps leave it: see
        ``optim.step``), else nothing."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def data_parallel(self, module: nn.Module) -> nn.Module:
        """``module`` wrapped in DDP over the trainers' group (gradients are
        averaged across trainers), or as it is with one trainer."""
        if self.ddp_group is None:
            return module
        return nn.parallel.DistributedDataParallel(module, process_group=self.ddp_group)

    def mean_over_trainers(self, value: torch.Tensor) -> torch.Tensor:
        """``value``'s mean over the trainers (each's own with one)."""
        if self.ddp_group is None:
            return value
        total = value.detach().clone()
        dist.all_reduce(total, group=self.ddp_group)
        return total / dist.get_world_size(self.ddp_group)

    @classmethod
    def check_dataset(cls, name: str, dataset: Optional[str]) -> None:
        """Refuse ``dataset=``: an online algorithm collects its own data (an offline one needs a
        dataset: :class:`~harness.algos.offline.OfflineAlgorithm`)."""
        if dataset:
            raise ValueError(
                f"dataset= is for offline algorithms (iql, cql); algo={name} collects its own data"
            )

    @classmethod
    def refuses_joining(cls, name: str) -> Optional[str]:
        """Why collectors of other launches cannot join a run of ``algo=name``; None: they can."""
        return None

    @classmethod
    def update_takes_a_round(cls, mode: str) -> bool:
        """One update learns from a batch of each of a trainer's collectors (``collector.mode``
        sync), so that their number decides what an update learns from."""
        return mode == "sync"

    def gradient_steps_in(self, updates: int) -> Optional[int]:
        """The gradient steps that ``updates`` updates took where the one fixes the other; None
        where it does not (an update of a round takes several, or none while a replay fills)."""
        return None

    @classmethod
    @abc.abstractmethod
    def make_policy(cls, cfg: ConfigT, spec: EnvSpec) -> PolicyT:
        """The collectors' module; trainers build the same one and train it."""

    @classmethod
    def make_models(cls, cfg: ConfigT, spec: EnvSpec) -> dict[str, nn.Module]:
        """The models collectors act with, by name: ``policy``, and with
        ``algo.normalize_obs`` the ``obs_norm`` it reads observations through.
        Collectors build them to receive the weights; trainers, to train them."""
        models: dict[str, nn.Module] = {"policy": cls.make_policy(cfg, spec)}
        if cfg.normalize_obs:
            models["obs_norm"] = ObsNormalizer(spec.obs_shape, cfg.obs_clip)
        return models

    @staticmethod
    def acting_policy(models: Mapping[str, nn.Module]) -> Policy:
        """What steps the envs, from ``make_models``' models: the policy, behind the normaliser if
        there is one."""
        policy = cast(Policy, models["policy"])  # make_policy's
        return (
            NormalizedPolicy(policy, cast(ObsNormalizer, models["obs_norm"]))
            if "obs_norm" in models
            else policy
        )

    def published_models(self) -> dict[str, nn.Module]:
        """The models whose weights travel to collectors, by name (``make_models``')."""
        return dict(self.models)

    def normalized(self, obs: torch.Tensor) -> torch.Tensor:
        """``obs`` as the networks see them: normalised with the current statistics, if the
        algorithm normalises."""
        return obs if self.obs_norm is None else self.obs_norm(obs)

    def normalized_batch(self, batch: TensorDict) -> TensorDict:
        """``batch`` with ``obs`` and ``next_obs`` as the networks see them (``normalized``)."""
        if self.obs_norm is None:
            return batch
        return batch.set("obs", self.obs_norm(batch["obs"])).set(
            "next_obs", self.obs_norm(batch["next_obs"])
        )

    @abc.abstractmethod
    def update(self, batches: list[TensorDict], frames: int) -> Mapping[str, torch.Tensor | float]:
        """Learn from one round of collectors' batches; ``frames`` counts env
        frames before them. Returns metrics named ``train/...``: detached
        tensors (or numbers), read with ``float()`` once per log row, so that
        no step waits for the device."""

    def values_for_header(self, frames: int) -> dict[str, float]:
        """The named floats that travel to collectors with the weights."""
        return {}

    @abc.abstractmethod
    def checkpointed(self) -> dict[str, Stateful]:
        """Everything with a ``state_dict`` that a checkpoint must hold: models
        (unwrapped from DDP) and optimisers, by name."""

    def stateful(self) -> dict[str, Stateful]:
        """``checkpointed``'s, and the observation normaliser's statistics when there is one."""
        return {
            **self.checkpointed(),
            **({"obs_norm": self.obs_norm} if self.obs_norm is not None else {}),
        }

    def state_dict(self) -> dict:
        """Every ``stateful`` object's state, and ``gradient_steps`` (schedules count them: CQL's
        ``bc_steps``, delayed actor and target updates); a module's as a copy: the published models
        share one packed buffer (float32 weights, float64 statistics), and torch.save refuses views
        of one storage as two dtypes."""
        return {
            **{
                name: {k: v.clone() for k, v in obj.state_dict().items()}
                if isinstance(obj, nn.Module)
                else obj.state_dict()
                for name, obj in self.stateful().items()
            },
            "gradient_steps": self.gradient_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        for name, obj in self.stateful().items():
            obj.load_state_dict(state[name])
        # Older checkpoints lack it (TrainerState).
        self.gradient_steps = int(state.get("gradient_steps", 0))
