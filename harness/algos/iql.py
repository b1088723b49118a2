"""Implicit Q-Learning (Kostrikov et al. 2022), as CORL's ``iql.py``.

Never queries actions outside the dataset: a value function V fits an upper
expectile of the target critics' Q over the dataset's actions; twin critics
regress on ``r + gamma * V(s')`` (the mean of their squared errors, as CORL);
the policy is extracted by advantage-weighted regression: dataset actions
weighted by ``exp(beta * (Q - V))``, clipped, onto a Gaussian actor (its
log-likelihood) or a deterministic one (``algo.deterministic_actor``: squared
error), whose learning rate follows a cosine from ``actor_lr`` to 0 over the
run's ``gradient_steps``, as CORL's ``CosineAnnealingLR``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn

from harness.algos.base import Policy, Stateful, require_actions
from harness.algos.critics import Critics, critic_metrics
from harness.algos.nets import Bounds, mlp
from harness.algos.offline import OfflineAlgorithm, OfflineConfig
from harness.algos.optim import adam, step
from harness.algos.ranges import AT_LEAST_ONE, NON_NEGATIVE, OPEN_UNIT, POSITIVE, UNIT, ranged
from harness.core.specs import EnvSpec

EXP_ADV_MAX = 100.0  # the advantage weights' clip, as in the paper's code


@dataclass
class IQLConfig(OfflineConfig):
    """Defaults are CORL's ``iql.py`` for D4RL locomotion."""

    name: str = "iql"
    # tau of the value loss: 0.5 is the mean (SARSA), towards 1 the max
    expectile: float = ranged(0.7, OPEN_UNIT)
    beta: float = ranged(3.0, NON_NEGATIVE)  # inverse temperature of the advantage weights
    tau: float = ranged(0.005, UNIT)  # target critics' smoothing coefficient
    # at the first step; a cosine takes it to 0 at gradient_steps
    actor_lr: float = ranged(3e-4, POSITIVE)
    # CORL's iql_deterministic: a tanh MLP regressed onto the data's actions
    deterministic_actor: bool = False
    critic_lr: float = ranged(3e-4, POSITIVE)  # critics and value function
    hidden: int = ranged(256, AT_LEAST_ONE)  # width of every network's two hidden layers


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """Asymmetric squared error: positive ``diff`` (Q above V) weighs
    ``expectile``, negative ``1 - expectile``."""
    weight = torch.where(diff < 0, 1 - expectile, expectile)
    return (weight * diff.pow(2)).mean()


class GaussianPolicy(Policy):
    """A Gaussian over actions: mean from the observation, squashed into the
    action box; a learned log-std per action dimension."""

    def __init__(self, spec: EnvSpec, hidden: int):
        super().__init__()
        self.net = mlp(spec.obs_dim, [hidden, hidden], spec.num_actions, activation=nn.ReLU)
        self.log_std = nn.Parameter(torch.zeros(spec.num_actions))
        self.bounds = Bounds(spec)

    def distribution(self, obs: torch.Tensor) -> torch.distributions.Normal:
        """The action distribution at ``obs``."""
        mean = torch.tanh(self.net(obs.flatten(1)).float()) * self.bounds.scale + self.bounds.bias
        return torch.distributions.Normal(
            mean, self.log_std.clamp(-20.0, 2.0).exp(), validate_args=False
        )

    def forward(
        self, obs: torch.Tensor, values: Mapping[str, float] = {}, deterministic: bool = False
    ) -> TensorDict:
        dist = self.distribution(obs)
        action = dist.mean if deterministic else dist.sample()
        return TensorDict(action=self.bounds.clamp(action), batch_size=obs.shape[:1])

    def regression_loss(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Per sample: the negative log-likelihood of the dataset's ``action``."""
        return -self.distribution(obs).log_prob(action).sum(-1)


class DeterministicPolicy(Policy):
    """An action from the observation, squashed into the action box (CORL's
    ``DeterministicPolicy``); it acts the same whether asked for evaluation or not."""

    def __init__(self, spec: EnvSpec, hidden: int):
        super().__init__()
        self.net = mlp(spec.obs_dim, [hidden, hidden], spec.num_actions, activation=nn.ReLU)
        self.bounds = Bounds(spec)

    def action(self, obs: torch.Tensor) -> torch.Tensor:
        """The action at ``obs``."""
        return torch.tanh(self.net(obs.flatten(1)).float()) * self.bounds.scale + self.bounds.bias

    def forward(
        self, obs: torch.Tensor, values: Mapping[str, float] = {}, deterministic: bool = False
    ) -> TensorDict:
        return TensorDict(action=self.action(obs), batch_size=obs.shape[:1])

    def regression_loss(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Per sample: the squared distance to the dataset's ``action``."""
        return (self.action(obs) - action).pow(2).sum(-1)


IQLPolicy = GaussianPolicy | DeterministicPolicy


class IQL(OfflineAlgorithm[IQLConfig, IQLPolicy]):
    """IQL's trainer side: twin critics, value function, actor."""

    Config = IQLConfig
    compiled = ("value_loss", "critic_loss", "actor_loss")

    # *args, **kwargs: as Algorithm's
    def __init__(self, cfg: IQLConfig, spec: EnvSpec, *args: Any, **kwargs: Any):
        super().__init__(cfg, spec, *args, **kwargs)
        self.critics = Critics(spec, cfg.hidden).to(self.device)
        self.value = mlp(spec.obs_dim, [cfg.hidden, cfg.hidden], 1, activation=nn.ReLU).to(
            self.device
        )
        self.q_optimizer = adam(self.critics.online.parameters(), lr=cfg.critic_lr)
        self.value_optimizer = adam(self.value.parameters(), lr=cfg.critic_lr)
        self.actor_optimizer = adam(self.policy.parameters(), lr=cfg.actor_lr)

    @classmethod
    def make_policy(cls, cfg: IQLConfig, spec: EnvSpec) -> IQLPolicy:
        require_actions(
            spec, False, "algo=iql is built for continuous actions; use algo=cql for discrete ones"
        )
        return (DeterministicPolicy if cfg.deterministic_actor else GaussianPolicy)(
            spec, cfg.hidden
        )

    def checkpointed(self) -> dict[str, Stateful]:
        return {
            "policy": self.policy,
            "critics": self.critics,
            "value": self.value,
            "q_optimizer": self.q_optimizer,
            "value_optimizer": self.value_optimizer,
            "actor_optimizer": self.actor_optimizer,
        }

    def value_loss(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """V towards the upper expectile of the target critics' min Q over the dataset's actions;
        and Q - V."""
        target_q = self.critics.targets(obs, action).min(0).values
        advantage = target_q - self.value(obs).float().squeeze(-1)
        return expectile_loss(advantage, self.cfg.expectile), advantage

    def critic_loss(
        self, batch: TensorDict, next_v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Critics towards r + gamma * V(s'): no action outside the dataset is ever valued."""
        target = batch["reward"] + (1 - batch["terminated"].float()) * self.cfg.gamma * next_v
        q = self.critics(batch["obs"], batch["action"])  # [2, B]
        # the mean of the critics' mean squared TD errors (CORL's)
        return (q - target).pow(2).mean(), q

    def actor_loss(
        self, obs: torch.Tensor, action: torch.Tensor, advantage: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Advantage-weighted regression onto the dataset's actions; and the weights."""
        weights = torch.exp(self.cfg.beta * advantage).clamp(max=EXP_ADV_MAX)
        return (weights * self.policy.regression_loss(obs, action)).mean(), weights

    def actor_lr(self) -> float:
        """CORL's cosine annealing from ``actor_lr`` to 0 over the run (its scheduler steps after
        each update: step k uses the value for k - 1). A function of the step count, so a resumed
        run takes it up again."""
        progress = min(self.gradient_steps - 1, self.cfg.gradient_steps) / self.cfg.gradient_steps
        return self.cfg.actor_lr * (1 + math.cos(math.pi * progress)) / 2

    def learn(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        obs, action = batch["obs"].flatten(1), batch["action"]
        with torch.no_grad():  # V(s') before V's step, as CORL
            next_v = self.value(batch["next_obs"].flatten(1)).float().squeeze(-1)
        value_loss, advantage = self.value_loss(obs, action)
        step(self.value_optimizer, value_loss)
        q_loss, q = self.critic_loss(batch, next_v)
        step(self.q_optimizer, q_loss)
        actor_loss, weights = self.actor_loss(obs, action, advantage.detach())
        actor_lr = self.actor_lr()
        for group in self.actor_optimizer.param_groups:
            group["lr"] = actor_lr
        step(self.actor_optimizer, actor_loss)
        self.critics.update_targets(self.cfg.tau)
        return {
            **critic_metrics(q, q_loss),
            "train/value_loss": value_loss.detach(),
            "train/actor_loss": actor_loss.detach(),
            "train/advantage": advantage.detach().mean(),
            "train/adv_weight": weights.mean(),
            # a fill on the device: no copy, no wait
            "train/actor_lr": torch.full((), actor_lr, device=self.device),
        }
