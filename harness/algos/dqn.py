"""Deep Q-Network (Mnih et al. 2015), as CleanRL's ``dqn.py``, with a
double-DQN option (van Hasselt et al. 2016).

Epsilon-greedy exploration runs on the collectors; its schedule (linear from
``start_e`` to ``end_e`` over ``exploration_fraction`` of the run) is driven
by the global frame count and travels with the weights as the ``epsilon``
header value. A target network is copied (or Polyak-averaged, ``tau`` < 1)
every ``target_network_frequency`` gradient steps.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn

from harness.algos.base import Policy, Stateful, require_actions
from harness.algos.critics import soft_update
from harness.algos.nets import network
from harness.algos.offpolicy import OffPolicyAlgorithm, OffPolicyConfig
from harness.algos.optim import adam, step
from harness.algos.ranges import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, PROBABILITY, UNIT, ranged
from harness.core.specs import EnvSpec


@dataclass
class DQNConfig(OffPolicyConfig):
    """Defaults are CleanRL's ``dqn.py`` (CartPole); train_frequency 10 there is update_to_data 0.1
    here."""

    name: str = "dqn"
    buffer_size: int = ranged(10_000, AT_LEAST_ONE)
    batch_size: int = ranged(128, AT_LEAST_ONE)
    learning_starts: int = ranged(10_000, NON_NEGATIVE)
    update_to_data: float = ranged(0.1, POSITIVE)
    learning_rate: float = ranged(2.5e-4, POSITIVE)  # Adam learning rate
    tau: float = ranged(1.0, UNIT)  # target update: 1 copies, < 1 averages
    # Gradient steps between target updates: CleanRL's 500 env steps at one step per 10 frames.
    target_network_frequency: int = ranged(50, AT_LEAST_ONE)
    start_e: float = ranged(1.0, PROBABILITY)  # epsilon at the start
    end_e: float = ranged(0.05, PROBABILITY)  # epsilon at the end of the schedule
    # fraction of collector.total_frames over which epsilon decays
    exploration_fraction: float = ranged(0.5, UNIT)
    # pick the next action with the online network, value it with the target
    double_dqn: bool = False
    hidden_sizes: tuple[int, ...] = (120, 84)  # Q-network widths


class QPolicy(Policy):
    """A Q-network acting epsilon-greedily (DQN's, and discrete CQL's)."""

    def __init__(self, spec: EnvSpec, hidden_sizes: Sequence[int]):
        super().__init__()
        self.num_actions = spec.num_actions
        self.net = network(spec, list(hidden_sizes), spec.num_actions, activation=nn.ReLU)

    def q(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values of every action, ``[B, num_actions]``."""
        # float32 values under algo.amp too: TD targets need the precision
        return self.net(obs.flatten(1)).float()

    def forward(
        self, obs: torch.Tensor, values: Mapping[str, float] = {}, deterministic: bool = False
    ) -> TensorDict:
        action = self.q(obs).argmax(-1)
        if not deterministic:
            epsilon = 1.0 if values.get("random") else values.get("epsilon", 0.0)
            # on the policy's device: a GPU collector's too
            explore = torch.rand(obs.shape[0], device=obs.device) < epsilon
            action = torch.where(
                explore,
                torch.randint(0, self.num_actions, action.shape, device=action.device),
                action,
            )
        return TensorDict(action=action, batch_size=obs.shape[:1])


def epsilon_at(cfg: DQNConfig, frames: int, total_frames: int) -> float:
    """Linear decay from start_e to end_e over exploration_fraction of the run."""
    duration = max(cfg.exploration_fraction * total_frames, 1)
    return max(cfg.end_e, cfg.start_e + (cfg.end_e - cfg.start_e) * frames / duration)


class DQN(OffPolicyAlgorithm[DQNConfig, QPolicy]):
    """DQN's trainer side: the Q-network and its target."""

    Config = DQNConfig
    compiled = ("td_loss",)
    header_values = ("random", "epsilon")
    takes_pixels = True

    # *args, **kwargs: as Algorithm's
    def __init__(self, cfg: DQNConfig, spec: EnvSpec, *args: Any, **kwargs: Any):
        super().__init__(cfg, spec, *args, **kwargs)
        self.optimizer = adam(self.policy.parameters(), lr=cfg.learning_rate)
        self.target = copy.deepcopy(self.policy).requires_grad_(False)

    @classmethod
    def make_policy(cls, cfg: DQNConfig, spec: EnvSpec) -> QPolicy:
        require_actions(
            spec,
            True,
            "algo=dqn needs discrete actions; use algo=sac or algo=td3 for continuous ones",
        )
        return QPolicy(spec, cfg.hidden_sizes)

    def checkpointed(self) -> dict[str, Stateful]:
        return {"policy": self.policy, "target": self.target, "optimizer": self.optimizer}

    def values_for_header(self, frames: int) -> dict[str, float]:
        return {
            **super().values_for_header(frames),
            "epsilon": epsilon_at(self.cfg, frames, self.total_frames),
        }

    def td_target(self, batch: TensorDict) -> torch.Tensor:
        """r + gamma * max_a Q'(s', a) (double DQN: Q' of the online network's argmax)."""
        with torch.no_grad():
            next_q = self.target.q(batch["next_obs"])
            if self.cfg.double_dqn:  # the online network chooses, the target network values
                best = self.policy.q(batch["next_obs"]).argmax(-1, keepdim=True)
                next_value = next_q.gather(-1, best).squeeze(-1)
            else:
                next_value = next_q.max(-1).values
            return batch["reward"] + (1 - batch["terminated"].float()) * self.cfg.gamma * next_value

    def td_loss(self, batch: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean squared TD error of Q on the batch's actions; and those Q-values."""
        q = self.policy.q(batch["obs"]).gather(-1, batch["action"].long().unsqueeze(-1)).squeeze(-1)
        return F.mse_loss(q, self.td_target(batch)), q

    def learn(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        loss, q = self.td_loss(batch)
        step(self.optimizer, loss, self.ddp_group)
        if self.gradient_steps % self.cfg.target_network_frequency == 0:
            soft_update(self.target, self.policy, self.cfg.tau)
        return {"train/td_loss": loss.detach(), "train/q_values": q.detach().mean()}
