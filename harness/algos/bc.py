"""Behaviour cloning, as CORL's ``any_percent_bc.py`` at ``frac=1.0`` (its "BC" row): the floor
every offline table reports.

A deterministic actor (two ReLU layers, a tanh scaled into the action box) regresses onto the
dataset's actions by mean squared error, with Adam, on batches of every transition alike: no
reward, no value, no discount, so it reaches the behaviour policy's return at best (its mean
action, which may beat a noisy behaviour policy a little). The dataset loop, the normalised
observations (``algo.normalize_obs``, on by default as CORL's ``normalize``), evaluation and
checkpoints are the offline skeleton's (:mod:`harness.algos.offline`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict

from harness.algos.base import Stateful, require_actions
from harness.algos.iql import DeterministicPolicy
from harness.algos.offline import OfflineAlgorithm, OfflineConfig
from harness.algos.optim import adam, step
from harness.algos.ranges import AT_LEAST_ONE, POSITIVE, ranged
from harness.core.specs import EnvSpec


@dataclass
class BCConfig(OfflineConfig):
    """Defaults are CORL's ``any_percent_bc.py`` for D4RL locomotion (``gamma`` and
    ``reward_scale`` are unused: BC never sees a reward)."""

    name: str = "bc"
    lr: float = ranged(3e-4, POSITIVE)  # the actor's Adam learning rate
    hidden: int = ranged(256, AT_LEAST_ONE)  # width of the actor's two hidden layers
    # Normalise observations with the dataset's mean and variance (CORL's normalize, on there)
    normalize_obs: bool = True


class BC(OfflineAlgorithm[BCConfig, DeterministicPolicy]):
    """BC's trainer side: the actor and its optimiser."""

    Config = BCConfig
    compiled = ("loss",)

    # *args, **kwargs: as Algorithm's
    def __init__(self, cfg: BCConfig, spec: EnvSpec, *args: Any, **kwargs: Any):
        super().__init__(cfg, spec, *args, **kwargs)
        self.optimizer = adam(self.policy.parameters(), lr=cfg.lr)

    @classmethod
    def make_policy(cls, cfg: BCConfig, spec: EnvSpec) -> DeterministicPolicy:
        require_actions(
            spec,
            False,
            "algo=bc regresses onto continuous actions (CORL's BC); for discrete ones use algo=cql",
        )
        return DeterministicPolicy(spec, cfg.hidden)

    def checkpointed(self) -> dict[str, Stateful]:
        return {"policy": self.policy, "optimizer": self.optimizer}

    def loss(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The mean, over the batch and the action's dimensions, of the squared error to the
        dataset's ``action`` (CORL's ``F.mse_loss``)."""
        return (self.policy.action(obs) - action).pow(2).mean()

    def learn(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        loss = self.loss(batch["obs"].flatten(1), batch["action"])
        step(self.optimizer, loss)
        return {"train/actor_loss": loss.detach()}
