"""The skeleton every off-policy algorithm shares: store collectors' frames as
transitions in a replay buffer, then take ``update_to_data`` gradient steps
per stored frame once ``learning_starts`` frames are in. Before that,
collectors act at random (the ``random`` header value). With
``algo.normalize_obs`` the buffer keeps raw observations; the statistics
grow with every stored frame and each sampled batch is normalised with the
current ones (off by default, as in CleanRL's SAC and TD3).

With T trainers (``topology.trainers``) each keeps its own collectors' frames
in its own replay of ``buffer_size / T`` transitions and samples
``batch_size / T`` of them per step; the gradients (and the observation
statistics) are averaged over the trainers, so a step is one step on
``batch_size`` transitions, as with one trainer. Every trainer takes one batch
of the same size per update, so each counts the update's frames as T times
its own, and all take the same number of gradient steps.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch
import torch.distributed as dist
from tensordict import TensorDict

from harness.algos.base import AlgoConfig, Algorithm, PolicyT
from harness.algos.frame_replay import FrameReplay
from harness.algos.ranges import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT, ranged
from harness.algos.replay import ReplayBuffer
from harness.core.specs import EnvSpec


@dataclass
class OffPolicyConfig(AlgoConfig):
    """Fields every off-policy algorithm has."""

    # replay capacity in transitions, over all trainers (memory is allocated at start)
    buffer_size: int = ranged(1_000_000, AT_LEAST_ONE)
    # transitions per gradient step, over all trainers (a multiple of topology.trainers)
    batch_size: int = ranged(256, AT_LEAST_ONE)
    # frames of random actions before the first update
    learning_starts: int = ranged(5_000, NON_NEGATIVE)
    # gradient steps per collected frame, whatever the number of collectors and trainers
    update_to_data: float = ranged(1.0, POSITIVE)
    gamma: float = ranged(0.99, UNIT)  # discount
    memmap_dir: str = ""  # keep the replay buffer on disk here (memory-mapped); "" keeps it in RAM
    # cpu: RAM, each sample staged to the trainer's GPU; trainer: on the trainer's device (GPU
    # memory)
    replay_device: str = "cpu"
    # stacked image observations: store each frame once, rebuild stacks when sampled (7x less on
    # Atari)
    replay_frames: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.replay_device not in ("cpu", "trainer"):
            raise ValueError(
                f"algo.replay_device={self.replay_device!r}: choose cpu (RAM) or trainer (the "
                "trainer's device, a GPU's memory when it has one)"
            )
        if self.replay_device == "trainer" and self.memmap_dir:
            raise ValueError(
                "algo.replay_device=trainer and algo.memmap_dir both place the "
                "replay buffer: choose one"
            )


OffPolicyConfigT = TypeVar("OffPolicyConfigT", bound=OffPolicyConfig)


class OffPolicyAlgorithm(Algorithm[OffPolicyConfigT, PolicyT]):
    """An algorithm that learns from a replay of collectors' frames, ``learn`` per gradient step."""

    needs_next_obs = True
    # each trainer its own replay; ``step(..., self.ddp_group)`` averages gradients
    data_parallel_trainers = True
    # 1 while collectors should act at random
    header_values: ClassVar[tuple[str, ...]] = ("random",)

    # *args, **kwargs: as Algorithm's
    def __init__(self, cfg: OffPolicyConfigT, spec: EnvSpec, *args: Any, **kwargs: Any):
        super().__init__(cfg, spec, *args, **kwargs)
        self.buffer: ReplayBuffer | FrameReplay | None = None  # made from the first batch's layout
        self.owed = 0.0  # fractional gradient steps carried to the next batch
        self.replay_device = self.device if cfg.replay_device == "trainer" else torch.device("cpu")
        self.trainers = 1 if self.ddp_group is None else dist.get_world_size(self.ddp_group)
        # each trainer holds 1/T of the replay, also once resumed
        self.replay_capacity = -(-cfg.buffer_size // self.trainers)

    def values_for_header(self, frames: int) -> dict[str, float]:
        return {"random": float(frames < self.cfg.learning_starts)}

    @staticmethod
    def transitions(batch: TensorDict) -> TensorDict:
        """A collector's batch as flat transitions ``[T * N]``."""
        rollout = batch["rollout"]
        return rollout.select("obs", "action", "reward", "next_obs", "terminated").reshape(-1)

    def _store(self, batch: TensorDict) -> TensorDict:
        """Append ``batch`` to the replay (made from the first batch's layout); its flat
        transitions."""
        data = self.transitions(batch)
        where = (self.cfg.memmap_dir or None, self.replay_device)
        if self.cfg.replay_frames:  # by env column: consecutive stacks share frames
            rollout = batch["rollout"].select(*data.keys())
            self.buffer = self.buffer or FrameReplay(self.replay_capacity, rollout, *where)
            self.buffer.extend(rollout)
        else:
            self.buffer = self.buffer or ReplayBuffer(self.replay_capacity, data[0], *where)
            # raw observations: each sample is normalised with the statistics of its step
            self.buffer.extend(data)
        return data

    def update(self, batches: list[TensorDict], frames: int) -> dict[str, torch.Tensor | float]:
        for batch in batches:
            data = self._store(batch)
            # every trainer's frames: one batch each per update, so the collective matches
            if self.obs_norm is not None:
                self.obs_norm.update(data["obs"], self.ddp_group)
            # every trainer got as many frames: the same count, hence the same steps
            new = data.shape[0] * self.trainers
            frames += new
            if frames > self.cfg.learning_starts:
                self.owed += self.cfg.update_to_data * new
        # made from the first batch; every update but offline ones' has one
        assert self.buffer is not None
        metrics: dict[str, torch.Tensor] = {}
        while self.owed >= 1:
            self.owed -= 1
            self.gradient_steps += 1
            # On a GPU trainer: gathered into pinned memory and moved with one copy (HostToDevice).
            sample = self.buffer.take(
                self.buffer.sample_index(self.cfg.batch_size // self.trainers), self.to_device
            )
            batch = self.normalized_batch(sample)
            with self.autocast():
                metrics = self.learn(batch)
        return {
            **metrics,
            "train/gradient_steps": self.gradient_steps,
            "train/replay_size": self.buffer.size * self.trainers,
        }

    def replay_state(self) -> dict | None:
        """The replay buffer, for checkpoints that keep it."""
        return (
            None
            if self.buffer is None
            else {
                **self.buffer.state_dict(),
                "owed": self.owed,
                "gradient_steps": self.gradient_steps,
            }
        )

    def load_replay_state(self, state: dict) -> None:
        kind = FrameReplay if self.cfg.replay_frames else ReplayBuffer
        self.buffer = kind.from_state(
            state, self.replay_capacity, self.cfg.memmap_dir or None, self.replay_device
        )
        self.owed, self.gradient_steps = state["owed"], state["gradient_steps"]

    @abc.abstractmethod
    def learn(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        """One gradient step on ``batch``; returns ``train/...`` metrics as detached tensors."""
