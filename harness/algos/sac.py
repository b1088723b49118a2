"""Soft Actor-Critic (Haarnoja et al. 2018), as CleanRL's ``sac_continuous_action.py``.

Twin Q networks with Polyak-averaged targets, a tanh-squashed Gaussian actor,
delayed actor updates (``policy_frequency`` of them every ``policy_frequency``
steps) and automatic entropy tuning towards ``-action_dims``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn

from harness.algos.base import Policy
from harness.algos.nets import mlp
from harness.algos.offpolicy import OffPolicyAlgorithm, OffPolicyConfig, soft_update
from harness.collect.envs import EnvSpec
from harness.packing import pack_parameters_

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@dataclass
class SACConfig(OffPolicyConfig):
    """Defaults are CleanRL's ``sac_continuous_action.py``."""

    name: str = "sac"
    policy_lr: float = 3e-4  # actor Adam learning rate
    q_lr: float = 1e-3  # critics' (and alpha's) Adam learning rate
    tau: float = 0.005  # target smoothing coefficient
    policy_frequency: int = 2  # actor updates come in bursts of this many, every this many steps
    alpha: float = 0.2  # entropy weight when not tuned
    autotune: bool = True  # tune alpha towards a target entropy of -action_dims
    hidden: int = 256  # width of the two hidden layers


def q_network(spec: EnvSpec, hidden: int) -> nn.Module:
    return mlp(spec.obs_dim + spec.num_actions, [hidden, hidden], 1, activation=nn.ReLU)


def critic_step(q1: nn.Module, q2: nn.Module, optimizer: torch.optim.Optimizer, batch: TensorDict, target: torch.Tensor) -> dict[str, float]:
    """One step of both critics towards ``target`` (shared by SAC and TD3)."""
    q_input = torch.cat([batch["obs"].flatten(1), batch["action"]], -1)
    q1_value, q2_value = q1(q_input).squeeze(-1), q2(q_input).squeeze(-1)
    q_loss = F.mse_loss(q1_value, target) + F.mse_loss(q2_value, target)
    optimizer.zero_grad()
    q_loss.backward()
    optimizer.step()
    return {"train/q_loss": q_loss.item(), "train/q1": q1_value.mean().item(), "train/q2": q2_value.mean().item()}


class Bounds(nn.Module):
    """The action box as buffers: ``low + (tanh(u) + 1) / 2 * (high - low)``."""

    def __init__(self, spec: EnvSpec):
        super().__init__()
        low, high = torch.tensor(spec.action_low), torch.tensor(spec.action_high)
        self.register_buffer("scale", (high - low) / 2)
        self.register_buffer("bias", (high + low) / 2)

    def random(self, n: int) -> torch.Tensor:
        return self.bias + self.scale * (2 * torch.rand(n, self.scale.numel()) - 1)


class SACPolicy(Policy):
    def __init__(self, spec: EnvSpec, hidden: int):
        super().__init__()
        self.trunk = mlp(spec.obs_dim, [hidden], hidden, activation=nn.ReLU)
        self.mean, self.log_std = nn.Linear(hidden, spec.num_actions), nn.Linear(hidden, spec.num_actions)
        self.bounds = Bounds(spec)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A reparameterised action, its log-probability, and the mean action."""
        h = F.relu(self.trunk(obs.flatten(1)))
        mean = self.mean(h)
        log_std = torch.tanh(self.log_std(h))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)
        normal = torch.distributions.Normal(mean, log_std.exp(), validate_args=False)
        u = normal.rsample()
        y = torch.tanh(u)
        action = y * self.bounds.scale + self.bounds.bias
        # Change of variables for the squashing, as in the paper's appendix C.
        log_prob = (normal.log_prob(u) - torch.log(self.bounds.scale * (1 - y.pow(2)) + 1e-6)).sum(-1)
        return action, log_prob, torch.tanh(mean) * self.bounds.scale + self.bounds.bias

    def forward(self, obs: torch.Tensor, values: Mapping[str, float] = {}, deterministic: bool = False) -> TensorDict:
        if values.get("random"):
            return TensorDict(action=self.bounds.random(obs.shape[0]), batch_size=obs.shape[:1])
        action, _, mean = self.sample(obs)
        return TensorDict(action=mean if deterministic else action, batch_size=obs.shape[:1])


class SAC(OffPolicyAlgorithm):
    Config = SACConfig

    def __init__(self, cfg: SACConfig, spec: EnvSpec, total_frames: int, ddp_group=None):
        super().__init__(cfg, spec, total_frames, ddp_group)
        self.actor = pack_parameters_(self.make_policy(cfg, spec))
        self.q1, self.q2 = q_network(spec, cfg.hidden), q_network(spec, cfg.hidden)
        self.q1_target, self.q2_target = copy.deepcopy(self.q1), copy.deepcopy(self.q2)
        self.q_optimizer = torch.optim.Adam([*self.q1.parameters(), *self.q2.parameters()], lr=cfg.q_lr)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=cfg.policy_lr)
        self.target_entropy = -float(spec.num_actions)
        self.log_alpha = torch.zeros(1, requires_grad=True)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=cfg.q_lr)

    @classmethod
    def make_policy(cls, cfg: SACConfig, spec: EnvSpec) -> SACPolicy:
        if spec.discrete:
            raise ValueError("algo=sac needs continuous actions; use algo=dqn or algo=ppo for discrete ones")
        return SACPolicy(spec, cfg.hidden)

    def published_models(self) -> dict[str, nn.Module]:
        return {"policy": self.actor}

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.exp().detach() if self.cfg.autotune else torch.tensor(self.cfg.alpha)

    def checkpointed(self) -> dict[str, object]:
        return {"actor": self.actor, "q1": self.q1, "q2": self.q2, "q1_target": self.q1_target, "q2_target": self.q2_target,
                "q_optimizer": self.q_optimizer, "actor_optimizer": self.actor_optimizer, "alpha_optimizer": self.alpha_optimizer,
                "log_alpha": _TensorState(self.log_alpha)}

    def q_target(self, batch: TensorDict) -> torch.Tensor:
        """r + gamma * (min_i Q_i'(s', a') - alpha * log pi(a'|s')), a' ~ pi(s'); no bootstrap past termination."""
        with torch.no_grad():
            next_action, next_log_prob, _ = self.actor.sample(batch["next_obs"])
            next_input = torch.cat([batch["next_obs"].flatten(1), next_action], -1)
            next_q = torch.min(self.q1_target(next_input), self.q2_target(next_input)).squeeze(-1) - self.alpha * next_log_prob
            return batch["reward"] + (1 - batch["terminated"].float()) * self.cfg.gamma * next_q

    def learn(self, batch: TensorDict) -> dict[str, float]:
        cfg = self.cfg
        metrics = critic_step(self.q1, self.q2, self.q_optimizer, batch, self.q_target(batch))

        if self.gradient_steps % cfg.policy_frequency == 0:  # delayed, then as many steps as were skipped
            for _ in range(cfg.policy_frequency):
                action, log_prob, _ = self.actor.sample(batch["obs"])
                q_pi_input = torch.cat([batch["obs"].flatten(1), action], -1)
                q_pi = torch.min(self.q1(q_pi_input), self.q2(q_pi_input)).squeeze(-1)
                actor_loss = (self.alpha * log_prob - q_pi).mean()
                self.actor_optimizer.zero_grad()
                actor_loss.backward()
                self.actor_optimizer.step()
                if cfg.autotune:
                    with torch.no_grad():
                        _, log_prob, _ = self.actor.sample(batch["obs"])
                    alpha_loss = (-self.log_alpha.exp() * (log_prob + self.target_entropy)).mean()
                    self.alpha_optimizer.zero_grad()
                    alpha_loss.backward()
                    self.alpha_optimizer.step()
            metrics.update({"train/actor_loss": actor_loss.item(), "train/alpha": self.alpha.item(), "train/entropy": -log_prob.mean().item()})
        soft_update(self.q1_target, self.q1, cfg.tau)
        soft_update(self.q2_target, self.q2, cfg.tau)
        return metrics


class _TensorState:
    """A lone tensor (alpha's logarithm) as something with a state_dict."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def state_dict(self) -> dict:
        return {"value": self.tensor.detach().clone()}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            self.tensor.copy_(state["value"])
