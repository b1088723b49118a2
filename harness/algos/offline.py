"""The skeleton every offline algorithm shares: gradient steps on uniform
samples of a fixed dataset (``dataset=<path>``), no environment frames.

Collectors only evaluate the weights trainer 0 publishes, so progress is
counted in gradient steps: ``algo.gradient_steps`` is the run's length, and
``logger.log_every_frames`` / ``checkpoint.every_frames`` count gradient
steps too. Each sampled batch's rewards are multiplied by ``algo.reward_scale`` (and,
with ``algo.normalize_reward``, by CORL's factor from the dataset's episode returns);
with ``algo.normalize_obs`` its observations are normalised with the dataset's
mean and variance (CORL's ``normalize``), which travel to the evaluating
collectors with the policy as the online algorithms' running statistics do.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional, TypeVar

import torch
from tensordict import TensorDict

from harness.algos.base import AlgoConfig, Algorithm, PolicyT
from harness.algos.ranges import AT_LEAST_ONE, POSITIVE, UNIT, ranged
from harness.core.specs import EnvSpec

# Observations per pass of the normaliser's statistics: bounded memory on big datasets.
STATISTICS_CHUNK = 100_000


@dataclass
class OfflineConfig(AlgoConfig):
    """Fields every offline algorithm has."""

    gradient_steps: int = ranged(1_000_000, AT_LEAST_ONE)  # the run's length
    batch_size: int = ranged(256, AT_LEAST_ONE)  # transitions per gradient step
    gamma: float = ranged(0.99, UNIT)  # discount
    # Rewards are multiplied by this before learning (returns and eval/return stay in the env's
    # units). Penalty and temperature weights (cql_alpha, IQL's beta) are tuned for rewards of about
    # 1 per step: CORL scales D4RL locomotion rewards by episode length / (best - worst episode
    # return) for that. docs/offline.md.
    reward_scale: float = ranged(1.0, POSITIVE)
    # CORL's normalize_reward: rewards also times the env's episode cut-off / (highest - lowest
    # return of the dataset's episodes, from its meta.json), worked out when the dataset is read.
    normalize_reward: bool = False


OfflineConfigT = TypeVar("OfflineConfigT", bound=OfflineConfig)


class OfflineAlgorithm(Algorithm[OfflineConfigT, PolicyT]):
    """An algorithm that learns from ``use_dataset``'s transitions, one ``learn`` per ``update``."""

    offline = True

    # The rest of the arguments as Algorithm's.
    def __init__(self, cfg: OfflineConfigT, spec: EnvSpec, *args: Any, **kwargs: Any):
        super().__init__(cfg, spec, *args, **kwargs)
        self.data: TensorDict | None = None
        self.reward_scale = cfg.reward_scale  # and use_dataset's normaliser

    @classmethod
    def check_dataset(cls, name: str, dataset: Optional[str]) -> None:
        """Refuse a run without ``dataset=``, saying how to write one."""
        if not dataset:
            raise ValueError(
                f"algo={name} learns from a dataset: add dataset=<path>. Write one with "
                "`harness dataset env=<env> policy=<run dir> out=<path>` "
                "(docs/offline.md)"
            )

    @classmethod
    def refuses_joining(cls, name: str) -> Optional[str]:
        return f"algo={name} learns from a dataset: there is nothing to collect"

    @classmethod
    def update_takes_a_round(cls, mode: str) -> bool:
        return False  # an update is a gradient step on the dataset; collectors only evaluate

    def gradient_steps_in(self, updates: int) -> Optional[int]:
        return updates  # an update is one gradient step

    def use_dataset(self, data: TensorDict, reward_normalizer: float = 1.0) -> None:
        """The transitions to learn from (memory-mapped is fine: only samples are read, and with
        ``algo.normalize_obs`` the observations once, in chunks, for their statistics); their
        rewards are multiplied by ``algo.reward_scale`` times ``reward_normalizer`` (with
        ``algo.normalize_reward``, :meth:`harness.data.format.Meta.reward_normalizer`)."""
        self.data = data
        self.reward_scale = self.cfg.reward_scale * reward_normalizer
        # The same statistics on every call: a resumed run recomputes what it saved.
        if self.obs_norm is not None:
            self.obs_norm.reset()
            for chunk in data["obs"].split(STATISTICS_CHUNK):
                self.obs_norm.update(chunk)

    def update(self, batches: list[TensorDict], frames: int) -> Mapping[str, torch.Tensor | float]:
        """One gradient step on a uniform sample of the dataset (collectors'
        messages carry evaluations, not frames)."""
        assert self.data is not None, "use_dataset() comes first"
        self.gradient_steps += 1
        index = torch.randint(0, self.data.shape[0], (self.cfg.batch_size,))
        batch = self.normalized_batch(self.to_device.sample(self.data, index))
        if self.reward_scale != 1.0:
            batch["reward"] = batch["reward"] * self.reward_scale
        with self.autocast():
            return self.learn(batch)

    @abc.abstractmethod
    def learn(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        """One gradient step on ``batch``; returns ``train/...`` metrics as detached tensors on the
        trainer's device."""
