"""A toy algorithm, added from outside the package: ``HARNESS_PLUGINS=toy_algo`` (with ``tests/`` on
the path) imports this module in every process before it composes a config; it adds ``toy_pg`` to
``ALGOS`` and its YAML node to Hydra's ConfigStore, so that ``algo=toy_pg`` works as
``conf/algo/<name>.yaml`` would (docs/extending.md; tests/launch/test_extending.py).

REINFORCE, the smallest real :class:`~harness.algos.base.Algorithm`: a linear softmax policy,
trained on each sync round's frames by the policy gradient of the discounted return-to-go.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from hydra.core.config_store import ConfigStore
from tensordict import TensorDict
from torch import nn
from torch.distributions import Categorical

from harness.algos import ALGOS
from harness.algos.base import AlgoConfig, Algorithm, Policy, Stateful, require_actions
from harness.algos.gae import gae
from harness.algos.optim import adam, step
from harness.algos.ranges import POSITIVE, UNIT, ranged
from harness.core.specs import EnvSpec


@dataclass
class ToyPGConfig(AlgoConfig):
    """REINFORCE's settings."""

    name: str = "toy_pg"
    lr: float = ranged(0.1, POSITIVE)  # Adam learning rate
    gamma: float = ranged(0.5, UNIT)  # discount of the return-to-go


class ToyPGPolicy(Policy):
    """Softmax over a linear map of the observation."""

    def __init__(self, spec: EnvSpec):
        super().__init__()
        self.logits = nn.Linear(spec.obs_shape[0], spec.num_actions)

    def distribution(self, obs: torch.Tensor) -> Categorical:
        return Categorical(logits=self.logits(obs).float(), validate_args=False)

    def forward(
        self, obs: torch.Tensor, values: Mapping[str, float] = {}, deterministic: bool = False
    ) -> TensorDict:
        dist = self.distribution(obs)
        action = dist.probs.argmax(-1) if deterministic else dist.sample()
        return TensorDict(action=action, batch_size=obs.shape[:1])


class ToyPG(Algorithm[ToyPGConfig, ToyPGPolicy]):
    """One gradient step per round: ascend log pi(a|s) times the normalised return-to-go."""

    Config = ToyPGConfig
    on_policy = True  # async mode: an update takes a round's frames, as sync mode does

    def __init__(self, cfg: ToyPGConfig, spec: EnvSpec, *args: Any, **kwargs: Any):
        super().__init__(cfg, spec, *args, **kwargs)
        self.optimizer = adam(self.policy.parameters(), lr=cfg.lr)

    @classmethod
    def make_policy(cls, cfg: ToyPGConfig, spec: EnvSpec) -> ToyPGPolicy:
        message = "algo=toy_pg acts in discrete action spaces only: pick a Discrete env"
        require_actions(spec, True, message)
        return ToyPGPolicy(spec)

    def update(self, batches: list[TensorDict], frames: int) -> dict[str, torch.Tensor | float]:
        keys = ("obs", "action", "reward", "done")
        rollouts = [b["rollout"].select(*keys) for b in batches]
        # One [T, N] round: torch.cat of TensorDicts is tensordict's (torch's stub says Tensor).
        rollout = self.to_device.move(cast(TensorDict, torch.cat(rollouts, dim=1)))
        reward = rollout["reward"]
        # With values of 0 and lambda 1, GAE's advantages are the discounted returns-to-go.
        zeros = torch.zeros_like(reward)
        returns = gae(reward, zeros, rollout["done"], zeros[0], self.cfg.gamma, 1.0)
        advantage = (returns - returns.mean()) / (returns.std() + 1e-8)
        with self.autocast():
            dist = self.policy.distribution(self.normalized(rollout["obs"]))
            loss = -(dist.log_prob(rollout["action"]) * advantage).mean()
        step(self.optimizer, loss)
        self.gradient_steps += 1
        return {"train/pg_loss": loss.detach(), "train/reward_per_frame": reward.mean()}

    def checkpointed(self) -> dict[str, Stateful]:
        return {"policy": self.policy, "optimizer": self.optimizer}


ALGOS["toy_pg"] = ToyPG
# What conf/algo/toy_pg.yaml would hold: the dataclass types and checks every value.
ConfigStore.instance().store(group="algo", name="toy_pg", node=ToyPGConfig)
