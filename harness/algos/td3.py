"""Twin Delayed DDPG (Fujimoto et al. 2018), as CleanRL's ``td3_continuous_action.py``.

Twin Q networks and clipped double-Q targets, target policy smoothing
(clipped noise on the target action), actor and target updates every
``policy_frequency`` critic updates, Gaussian exploration noise added by the
collectors.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn

from harness.algos.base import Policy, Stateful, require_actions
from harness.algos.critics import Critics, critic_metrics, soft_update
from harness.algos.nets import Bounds, mlp
from harness.algos.offpolicy import OffPolicyAlgorithm, OffPolicyConfig
from harness.algos.optim import adam, step
from harness.algos.ranges import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT, ranged
from harness.core.specs import EnvSpec


@dataclass
class TD3Config(OffPolicyConfig):
    """Defaults are CleanRL's ``td3_continuous_action.py`` (learning_starts: 25k there)."""

    name: str = "td3"
    learning_rate: float = ranged(3e-4, POSITIVE)  # Adam learning rate, actor and critics
    tau: float = ranged(0.005, UNIT)  # target smoothing coefficient
    # one actor (and target) update per this many critic updates
    policy_frequency: int = ranged(2, AT_LEAST_ONE)
    # collectors' Gaussian noise, in units of the action half-range
    exploration_noise: float = ranged(0.1, NON_NEGATIVE)
    policy_noise: float = ranged(0.2, NON_NEGATIVE)  # target policy smoothing noise, same units
    noise_clip: float = ranged(0.5, NON_NEGATIVE)  # clip of that noise
    hidden: int = ranged(256, AT_LEAST_ONE)  # width of the two hidden layers


class TD3Policy(Policy):
    """A deterministic actor squashed into the action box, with Gaussian exploration noise."""

    def __init__(self, spec: EnvSpec, hidden: int, exploration_noise: float):
        super().__init__()
        self.net = mlp(spec.obs_dim, [hidden, hidden], spec.num_actions, activation=nn.ReLU)
        self.bounds = Bounds(spec)
        self.exploration_noise = exploration_noise

    def deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """The actor's action, without exploration noise."""
        return torch.tanh(self.net(obs.flatten(1)).float()) * self.bounds.scale + self.bounds.bias

    def forward(
        self, obs: torch.Tensor, values: Mapping[str, float] = {}, deterministic: bool = False
    ) -> TensorDict:
        if values.get("random"):
            return TensorDict(action=self.bounds.random(obs.shape[0]), batch_size=obs.shape[:1])
        action = self.deterministic(obs)
        if not deterministic:
            # Clipped into the box here, as CleanRL does before storing: the replay keeps the action
            # the env ran, so the critics never learn Q at actions no env step took (the collector
            # clips only its copy).
            action = self.bounds.clamp(
                action + torch.randn_like(action) * self.bounds.scale * self.exploration_noise
            )
        return TensorDict(action=action, batch_size=obs.shape[:1])


class TD3(OffPolicyAlgorithm[TD3Config, TD3Policy]):
    """TD3's trainer side: actor and its target, twin critics."""

    Config = TD3Config
    compiled = ("critic_loss",)

    # *args, **kwargs: as Algorithm's
    def __init__(self, cfg: TD3Config, spec: EnvSpec, *args: Any, **kwargs: Any):
        super().__init__(cfg, spec, *args, **kwargs)
        self.policy_target = copy.deepcopy(self.policy).requires_grad_(False)
        self.critics = Critics(spec, cfg.hidden).to(self.device)
        self.q_optimizer = adam(self.critics.online.parameters(), lr=cfg.learning_rate)
        self.actor_optimizer = adam(self.policy.parameters(), lr=cfg.learning_rate)

    @classmethod
    def make_policy(cls, cfg: TD3Config, spec: EnvSpec) -> TD3Policy:
        require_actions(
            spec,
            False,
            "algo=td3 needs continuous actions; use algo=dqn or algo=ppo for discrete ones",
        )
        return TD3Policy(spec, cfg.hidden, cfg.exploration_noise)

    def checkpointed(self) -> dict[str, Stateful]:
        return {
            "policy": self.policy,
            "policy_target": self.policy_target,
            "critics": self.critics,
            "q_optimizer": self.q_optimizer,
            "actor_optimizer": self.actor_optimizer,
        }

    def q_target(self, batch: TensorDict) -> torch.Tensor:
        """r + gamma * min_i Q_i'(s', pi'(s') + clip(noise)), clipped to the action box."""
        cfg, bounds = self.cfg, self.policy.bounds
        with torch.no_grad():
            noise = (torch.randn_like(batch["action"]) * cfg.policy_noise).clamp(
                -cfg.noise_clip, cfg.noise_clip
            ) * bounds.scale
            next_action = bounds.clamp(self.policy_target.deterministic(batch["next_obs"]) + noise)
            next_q = self.critics.targets(batch["next_obs"], next_action).min(0).values
            return batch["reward"] + (1 - batch["terminated"].float()) * cfg.gamma * next_q

    def critic_loss(self, batch: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        """Each critic's mean squared TD error, summed; and the critics' values ``[2, B]``."""
        q = self.critics(batch["obs"], batch["action"])
        return (q - self.q_target(batch)).pow(2).mean(1).sum(), q

    def learn(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        q_loss, q = self.critic_loss(batch)
        step(self.q_optimizer, q_loss, self.ddp_group)
        metrics = critic_metrics(q, q_loss)
        if self.gradient_steps % self.cfg.policy_frequency == 0:  # delayed actor and target updates
            # Q_1 only; the gradient reaches the actor, not the critic.
            actor_loss = -self.critics(
                batch["obs"], self.policy.deterministic(batch["obs"]), members=1, frozen=True
            ).mean()
            step(self.actor_optimizer, actor_loss, self.ddp_group)
            soft_update(self.policy_target, self.policy, self.cfg.tau)
            self.critics.update_targets(self.cfg.tau)
            metrics["train/actor_loss"] = actor_loss.detach()
        return metrics
