"""Conservative Q-Learning for discrete actions (Kumar et al. 2020), what
``algo=cql`` runs on a discrete action space (CartPole).

A Q-network (DQN's) whose TD loss gets ``logsumexp_a Q(s, a) - Q(s, a_data)``:
with every action enumerated, the soft maximum is exact. The target network is
copied (``tau`` 1) or averaged every ``target_update_every`` gradient steps.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from harness.algos.base import Stateful, require_actions
from harness.algos.conservative import CQLConfig, cql_penalty
from harness.algos.critics import soft_update
from harness.algos.dqn import QPolicy
from harness.algos.offline import OfflineAlgorithm
from harness.algos.optim import adam, step
from harness.core.specs import EnvSpec


class DiscreteCQL(OfflineAlgorithm[CQLConfig, QPolicy]):
    """Discrete CQL's trainer side: a Q-network and its target."""

    Config = CQLConfig
    compiled = ("losses",)
    # QPolicy's network is the Nature CNN on images, as DQN's (the CQL paper's Atari runs)
    takes_pixels = True

    @classmethod
    def make_policy(cls, cfg: CQLConfig, spec: EnvSpec) -> QPolicy:
        require_actions(
            spec,
            True,
            "discrete CQL needs discrete actions; algo=cql picks the continuous "
            "form for continuous ones",
        )
        return QPolicy(spec, (cfg.hidden, cfg.hidden))

    # *args, **kwargs: as Algorithm's
    def __init__(self, cfg: CQLConfig, spec: EnvSpec, *args: Any, **kwargs: Any):
        super().__init__(cfg, spec, *args, **kwargs)
        self.target = copy.deepcopy(self.policy).requires_grad_(False)
        self.q_optimizer = adam(self.policy.parameters(), lr=cfg.critic_lr)

    def checkpointed(self) -> dict[str, Stateful]:
        return {"policy": self.policy, "target": self.target, "q_optimizer": self.q_optimizer}

    def losses(self, batch: TensorDict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The TD loss, the conservative penalty, and Q on the dataset's actions."""
        q_all = self.policy.q(batch["obs"])
        q_data = q_all.gather(-1, batch["action"].long().unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            next_q = self.target.q(batch["next_obs"]).max(-1).values
            target = batch["reward"] + (1 - batch["terminated"].float()) * self.cfg.gamma * next_q
        # Every action is "sampled" once with density 1: the soft maximum is the exact logsumexp.
        return (
            F.mse_loss(q_data, target),
            cql_penalty(q_all, torch.zeros_like(q_all), q_data, self.cfg.temperature),
            q_data,
        )

    def learn(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        td_loss, penalty, q_data = self.losses(batch)
        step(self.q_optimizer, td_loss + self.cfg.cql_alpha * penalty)
        if self.gradient_steps % self.cfg.target_update_every == 0:
            soft_update(self.target, self.policy, self.cfg.tau)
        return {
            "train/td_loss": td_loss.detach(),
            "train/cql_penalty": penalty.detach(),
            "train/q_values": q_data.detach().mean(),
        }
