"""Soft Actor-Critic (Haarnoja et al. 2018), as CleanRL's ``sac_continuous_action.py``.

Twin Q networks with Polyak-averaged targets, a tanh-squashed Gaussian actor,
delayed actor updates (``policy_frequency`` of them every ``policy_frequency``
steps) and automatic entropy tuning towards ``-action_dims``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn

from harness.algos.base import Policy, Stateful, require_actions
from harness.algos.critics import Critics, critic_metrics
from harness.algos.nets import Bounds, LogScalar, mlp
from harness.algos.offpolicy import OffPolicyAlgorithm, OffPolicyConfig
from harness.algos.optim import adam, step
from harness.algos.ranges import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT, ranged
from harness.core.specs import EnvSpec

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


@dataclass
class SACConfig(OffPolicyConfig):
    """Defaults are CleanRL's ``sac_continuous_action.py``."""

    name: str = "sac"
    policy_lr: float = ranged(3e-4, POSITIVE)  # actor Adam learning rate
    q_lr: float = ranged(1e-3, POSITIVE)  # critics' (and alpha's) Adam learning rate
    tau: float = ranged(0.005, UNIT)  # target smoothing coefficient
    # actor updates come in bursts of this many, every this many steps
    policy_frequency: int = ranged(2, AT_LEAST_ONE)
    alpha: float = ranged(0.2, NON_NEGATIVE)  # entropy weight when not tuned
    autotune: bool = True  # tune alpha towards a target entropy of -action_dims
    hidden: int = ranged(256, AT_LEAST_ONE)  # width of the two hidden layers


class SACPolicy(Policy):
    """The tanh-squashed Gaussian actor (also CQL's)."""

    def __init__(self, spec: EnvSpec, hidden: int):
        super().__init__()
        self.trunk = mlp(spec.obs_dim, [hidden], hidden, activation=nn.ReLU)
        self.mean, self.log_std = (
            nn.Linear(hidden, spec.num_actions),
            nn.Linear(hidden, spec.num_actions),
        )
        self.bounds = Bounds(spec)

    def sample(
        self, obs: torch.Tensor, n: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A reparameterised action, its log-probability, and the mean action. With ``n``: ``n``
        actions per observation, ``[B, n, A]`` (log-probabilities ``[B, n]``), from one pass of the
        network."""
        mean, log_std = self.gaussian(obs)
        if n is not None:
            mean, log_std = (
                mean.unsqueeze(1).expand(-1, n, -1),
                log_std.unsqueeze(1).expand(-1, n, -1),
            )
        noise = torch.randn(mean.shape, device=mean.device)
        u = mean + noise * log_std.exp()
        y = torch.tanh(u)
        action = y * self.bounds.scale + self.bounds.bias
        return (
            action,
            self.squashed_log_prob(noise, log_std, y),
            torch.tanh(mean) * self.bounds.scale + self.bounds.bias,
        )

    def gaussian(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean and log-std of the Gaussian before the squashing."""
        h = F.relu(self.trunk(obs.flatten(1)))
        # float32 under algo.amp too: log-probabilities need the precision
        mean = self.mean(h).float()
        log_std = torch.tanh(self.log_std(h).float())
        return mean, LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)

    def log_prob(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The log-density of given actions ``[B, A]`` (a dataset's, for behaviour cloning),
        ``[B]``. Actions on the box's edge (saturated tanh policies write many) are moved 1e-4
        inside it, where the squashing is invertible and its inverse (about 5) no target a Gaussian
        cannot reach."""
        mean, log_std = self.gaussian(obs)
        y = ((action - self.bounds.bias) / self.bounds.scale).clamp(-1 + 1e-4, 1 - 1e-4)
        return self.squashed_log_prob((torch.atanh(y) - mean) / log_std.exp(), log_std, y)

    def squashed_log_prob(
        self, noise: torch.Tensor, log_std: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        """The log-density of ``y = tanh(mean + noise * std)`` scaled to the box: the Gaussian's at
        the pre-squash point, then the change of variables for the squashing (the paper's appendix
        C)."""
        return (
            -0.5 * noise.pow(2)
            - log_std
            - HALF_LOG_2PI
            - torch.log(self.bounds.scale * (1 - y.pow(2)) + 1e-6)
        ).sum(-1)

    def forward(
        self, obs: torch.Tensor, values: Mapping[str, float] = {}, deterministic: bool = False
    ) -> TensorDict:
        if values.get("random"):
            return TensorDict(action=self.bounds.random(obs.shape[0]), batch_size=obs.shape[:1])
        action, _, mean = self.sample(obs)
        return TensorDict(action=mean if deterministic else action, batch_size=obs.shape[:1])


class SAC(OffPolicyAlgorithm[SACConfig, SACPolicy]):
    """SAC's trainer side: actor, twin critics, entropy weight."""

    Config = SACConfig
    compiled = ("critic_loss",)

    # *args, **kwargs: as Algorithm's
    def __init__(self, cfg: SACConfig, spec: EnvSpec, *args: Any, **kwargs: Any):
        super().__init__(cfg, spec, *args, **kwargs)
        self.critics = Critics(spec, cfg.hidden).to(self.device)
        self.q_optimizer = adam(self.critics.online.parameters(), lr=cfg.q_lr)
        self.actor_optimizer = adam(self.policy.parameters(), lr=cfg.policy_lr)
        self.target_entropy = -float(spec.num_actions)
        self.log_alpha = LogScalar(1.0).to(self.device)
        self.alpha_optimizer = adam(self.log_alpha.parameters(), lr=cfg.q_lr)

    @classmethod
    def make_policy(cls, cfg: SACConfig, spec: EnvSpec) -> SACPolicy:
        require_actions(
            spec,
            False,
            "algo=sac needs continuous actions; use algo=dqn or algo=ppo for discrete ones",
        )
        return SACPolicy(spec, cfg.hidden)

    @property
    def alpha(self) -> torch.Tensor | float:
        """The entropy weight (a tensor without gradient when tuned)."""
        return self.log_alpha().detach() if self.cfg.autotune else self.cfg.alpha

    def checkpointed(self) -> dict[str, Stateful]:
        return {
            "policy": self.policy,
            "critics": self.critics,
            "log_alpha": self.log_alpha,
            "q_optimizer": self.q_optimizer,
            "actor_optimizer": self.actor_optimizer,
            "alpha_optimizer": self.alpha_optimizer,
        }

    def q_target(self, batch: TensorDict) -> torch.Tensor:
        """r + gamma * (min_i Q_i'(s', a') - alpha * log pi(a'|s')), a' ~ pi(s'); no bootstrap past
        termination."""
        with torch.no_grad():
            next_action, next_log_prob, _ = self.policy.sample(batch["next_obs"])
            next_q = (
                self.critics.targets(batch["next_obs"], next_action).min(0).values
                - self.alpha * next_log_prob
            )
            return batch["reward"] + (1 - batch["terminated"].float()) * self.cfg.gamma * next_q

    def critic_loss(self, batch: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        """Each critic's mean squared TD error, summed; and the critics' values ``[2, B]``."""
        q = self.critics(batch["obs"], batch["action"])
        return (q - self.q_target(batch)).pow(2).mean(1).sum(), q

    def learn(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        q_loss, q = self.critic_loss(batch)
        step(self.q_optimizer, q_loss, self.ddp_group)
        metrics = critic_metrics(q, q_loss)

        # delayed, then as many steps as were skipped
        if self.gradient_steps % cfg.policy_frequency == 0:
            for _ in range(cfg.policy_frequency):
                action, log_prob, _ = self.policy.sample(batch["obs"])
                # no gradient for the critics
                q_pi = self.critics(batch["obs"], action, frozen=True).min(0).values
                actor_loss = (self.alpha * log_prob - q_pi).mean()
                step(self.actor_optimizer, actor_loss, self.ddp_group)
                if cfg.autotune:
                    with torch.no_grad():
                        _, log_prob, _ = self.policy.sample(batch["obs"])
                    step(
                        self.alpha_optimizer,
                        (-self.log_alpha() * (log_prob + self.target_entropy)).mean(),
                        self.ddp_group,
                    )
            metrics.update(
                {
                    "train/actor_loss": actor_loss.detach(),
                    "train/alpha": torch.as_tensor(self.alpha),
                    "train/entropy": -log_prob.detach().mean(),
                }
            )
        self.critics.update_targets(cfg.tau)
        return metrics
