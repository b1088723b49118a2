"""Twin Delayed DDPG (Fujimoto et al. 2018), as CleanRL's ``td3_continuous_action.py``.

Twin Q networks and clipped double-Q targets, target policy smoothing
(clipped noise on the target action), actor and target updates every
``policy_frequency`` critic updates, Gaussian exploration noise added by the
collectors.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Mapping

import torch
from tensordict import TensorDict
from torch import nn

from harness.algos.base import Policy
from harness.algos.nets import mlp
from harness.algos.offpolicy import OffPolicyAlgorithm, OffPolicyConfig, soft_update
from harness.algos.sac import Bounds, critic_step, q_network
from harness.collect.envs import EnvSpec
from harness.packing import pack_parameters_


@dataclass
class TD3Config(OffPolicyConfig):
    """Defaults are CleanRL's ``td3_continuous_action.py`` (learning_starts: 25k there)."""

    name: str = "td3"
    learning_rate: float = 3e-4  # Adam learning rate, actor and critics
    tau: float = 0.005  # target smoothing coefficient
    policy_frequency: int = 2  # one actor (and target) update per this many critic updates
    exploration_noise: float = 0.1  # collectors' Gaussian noise, in units of the action half-range
    policy_noise: float = 0.2  # target policy smoothing noise, same units
    noise_clip: float = 0.5  # clip of that noise
    hidden: int = 256  # width of the two hidden layers


class TD3Policy(Policy):
    def __init__(self, spec: EnvSpec, hidden: int, exploration_noise: float):
        super().__init__()
        self.net = mlp(spec.obs_dim, [hidden, hidden], spec.num_actions, activation=nn.ReLU)
        self.bounds = Bounds(spec)
        self.exploration_noise = exploration_noise

    def deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(obs.flatten(1))) * self.bounds.scale + self.bounds.bias

    def forward(self, obs: torch.Tensor, values: Mapping[str, float] = {}, deterministic: bool = False) -> TensorDict:
        if values.get("random"):
            return TensorDict(action=self.bounds.random(obs.shape[0]), batch_size=obs.shape[:1])
        action = self.deterministic(obs)
        if not deterministic:
            action = action + torch.randn_like(action) * self.bounds.scale * self.exploration_noise
        return TensorDict(action=action, batch_size=obs.shape[:1])


class TD3(OffPolicyAlgorithm):
    Config = TD3Config

    def __init__(self, cfg: TD3Config, spec: EnvSpec, total_frames: int, ddp_group=None):
        super().__init__(cfg, spec, total_frames, ddp_group)
        self.actor = pack_parameters_(self.make_policy(cfg, spec))
        self.actor_target = copy.deepcopy(self.actor)
        self.q1, self.q2 = q_network(spec, cfg.hidden), q_network(spec, cfg.hidden)
        self.q1_target, self.q2_target = copy.deepcopy(self.q1), copy.deepcopy(self.q2)
        self.q_optimizer = torch.optim.Adam([*self.q1.parameters(), *self.q2.parameters()], lr=cfg.learning_rate)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=cfg.learning_rate)

    @classmethod
    def make_policy(cls, cfg: TD3Config, spec: EnvSpec) -> TD3Policy:
        if spec.discrete:
            raise ValueError("algo=td3 needs continuous actions; use algo=dqn or algo=ppo for discrete ones")
        return TD3Policy(spec, cfg.hidden, cfg.exploration_noise)

    def published_models(self) -> dict[str, nn.Module]:
        return {"policy": self.actor}

    def checkpointed(self) -> dict[str, object]:
        return {"actor": self.actor, "actor_target": self.actor_target, "q1": self.q1, "q2": self.q2,
                "q1_target": self.q1_target, "q2_target": self.q2_target,
                "q_optimizer": self.q_optimizer, "actor_optimizer": self.actor_optimizer}

    def q_target(self, batch: TensorDict) -> torch.Tensor:
        """r + gamma * min_i Q_i'(s', pi'(s') + clip(noise)), clipped to the action box."""
        cfg, bounds = self.cfg, self.actor.bounds
        with torch.no_grad():
            noise = (torch.randn_like(batch["action"]) * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip) * bounds.scale
            next_action = self.actor_target.deterministic(batch["next_obs"]) + noise
            next_action = torch.max(torch.min(next_action, bounds.bias + bounds.scale), bounds.bias - bounds.scale)
            next_input = torch.cat([batch["next_obs"].flatten(1), next_action], -1)
            next_q = torch.min(self.q1_target(next_input), self.q2_target(next_input)).squeeze(-1)
            return batch["reward"] + (1 - batch["terminated"].float()) * cfg.gamma * next_q

    def learn(self, batch: TensorDict) -> dict[str, float]:
        metrics = critic_step(self.q1, self.q2, self.q_optimizer, batch, self.q_target(batch))
        if self.gradient_steps % self.cfg.policy_frequency == 0:  # delayed actor and target updates
            actor_loss = -self.q1(torch.cat([batch["obs"].flatten(1), self.actor.deterministic(batch["obs"])], -1)).mean()
            self.actor_optimizer.zero_grad()
            actor_loss.backward()
            self.actor_optimizer.step()
            for target_net, net in ((self.actor_target, self.actor), (self.q1_target, self.q1), (self.q2_target, self.q2)):
                soft_update(target_net, net, self.cfg.tau)
            metrics["train/actor_loss"] = actor_loss.item()
        return metrics
