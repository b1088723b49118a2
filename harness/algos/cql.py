"""Conservative Q-Learning (Kumar et al. 2020), CQL(H) as CORL's ``cql.py``;
and its discrete form for discrete actions (CartPole).

Continuous actions: SAC (tanh-Gaussian actor, twin critics, tuned entropy)
whose critics also push down a soft maximum of Q over sampled actions
(uniform ones, and the policy's at ``s`` and ``s'``, importance-weighted by
their densities) and push up Q on the dataset's actions. With ``lagrange``
the penalty's weight is tuned so that the gap stays near
``target_action_gap``.

Discrete actions: a Q-network (DQN's) whose TD loss gets
``logsumexp_a Q(s, a) - Q(s, a_data)``; the soft maximum is exact.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn

from harness.algos.base import Policy
from harness.algos.dqn import QPolicy
from harness.algos.offline import OfflineAlgorithm, OfflineConfig
from harness.algos.offpolicy import soft_update
from harness.algos.sac import SACPolicy, _TensorState, q_network
from harness.collect.envs import EnvSpec
from harness.packing import pack_parameters_


@dataclass
class CQLConfig(OfflineConfig):
    """Defaults follow CORL's ``cql.py`` for D4RL locomotion, where they apply."""

    name: str = "cql"
    cql_alpha: float = 5.0  # weight of the conservative penalty
    n_actions: int = 10  # continuous: actions sampled per kind (uniform, pi(s), pi(s')) for the soft maximum
    temperature: float = 1.0  # of the soft maximum
    lagrange: bool = False  # continuous: tune the penalty's weight towards target_action_gap
    target_action_gap: float = 10.0  # with lagrange: the wanted soft-max(Q) - Q(data) gap
    actor_lr: float = 1e-4
    critic_lr: float = 3e-4
    tau: float = 0.005  # target critics' smoothing coefficient (discrete: 1 copies)
    target_update_every: int = 1  # gradient steps between target updates
    hidden: int = 256  # width of every network's two hidden layers

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cql_alpha < 0 or self.n_actions < 1 or self.temperature <= 0 or self.target_update_every < 1:
            raise ValueError("algo.cql_alpha >= 0, n_actions >= 1, temperature > 0 and target_update_every >= 1 are required")


def cql_penalty(q_sampled: torch.Tensor, log_density: torch.Tensor, q_data: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``mean(T * logsumexp((Q(s, a_i) - log p(a_i)) / T, i) - Q(s, a_data))``:
    a soft maximum of Q over sampled actions ``[B, N]`` (importance-weighted
    by the density they were drawn with) minus Q on the dataset's actions ``[B]``."""
    soft_max = temperature * torch.logsumexp((q_sampled - log_density) / temperature, dim=1)
    return (soft_max - q_data).mean()


class CQL(OfflineAlgorithm):
    Config = CQLConfig

    def __init__(self, cfg: CQLConfig, spec: EnvSpec, total_frames: int, ddp_group=None):
        super().__init__(cfg, spec, total_frames, ddp_group)
        self.actor = pack_parameters_(self.make_policy(cfg, spec))
        if spec.discrete:
            self.target = copy.deepcopy(self.actor)
            self.q_optimizer = torch.optim.Adam(self.actor.parameters(), lr=cfg.critic_lr)
            return
        self.q1, self.q2 = q_network(spec, cfg.hidden), q_network(spec, cfg.hidden)
        self.q1_target, self.q2_target = copy.deepcopy(self.q1), copy.deepcopy(self.q2)
        self.q_optimizer = torch.optim.Adam([*self.q1.parameters(), *self.q2.parameters()], lr=cfg.critic_lr)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=cfg.actor_lr)
        self.target_entropy = -float(spec.num_actions)
        self.log_alpha = torch.zeros(1, requires_grad=True)  # SAC's entropy weight
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=cfg.actor_lr)
        self.log_alpha_prime = torch.zeros(1, requires_grad=True)  # the penalty's Lagrange multiplier
        self.alpha_prime_optimizer = torch.optim.Adam([self.log_alpha_prime], lr=cfg.critic_lr)
        # Uniform actions have density 1 / volume of the action box.
        self.uniform_log_density = -float(torch.log(2 * self.actor.bounds.scale).sum())

    @classmethod
    def make_policy(cls, cfg: CQLConfig, spec: EnvSpec) -> Policy:
        return QPolicy(spec, (cfg.hidden, cfg.hidden)) if spec.discrete else SACPolicy(spec, cfg.hidden)

    def published_models(self) -> dict[str, nn.Module]:
        return {"policy": self.actor}

    def checkpointed(self) -> dict[str, object]:
        if self.spec.discrete:
            return {"q_net": self.actor, "target": self.target, "q_optimizer": self.q_optimizer}
        return {"actor": self.actor, "q1": self.q1, "q2": self.q2, "q1_target": self.q1_target, "q2_target": self.q2_target,
                "q_optimizer": self.q_optimizer, "actor_optimizer": self.actor_optimizer, "alpha_optimizer": self.alpha_optimizer,
                "alpha_prime_optimizer": self.alpha_prime_optimizer, "log_alpha": _TensorState(self.log_alpha),
                "log_alpha_prime": _TensorState(self.log_alpha_prime)}

    def learn(self, batch: TensorDict) -> dict[str, float]:
        return self.learn_discrete(batch) if self.spec.discrete else self.learn_continuous(batch)

    def learn_discrete(self, batch: TensorDict) -> dict[str, float]:
        cfg = self.cfg
        q_all = self.actor.q(batch["obs"])
        q_data = q_all.gather(-1, batch["action"].long().unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            next_q = self.target.q(batch["next_obs"]).max(-1).values
            target = batch["reward"] + (1 - batch["terminated"].float()) * cfg.gamma * next_q
        td_loss = F.mse_loss(q_data, target)
        # Every action is "sampled" once with density 1: the soft maximum is the exact logsumexp.
        penalty = cql_penalty(q_all, torch.zeros_like(q_all), q_data, cfg.temperature)
        loss = td_loss + cfg.cql_alpha * penalty
        self.q_optimizer.zero_grad()
        loss.backward()
        self.q_optimizer.step()
        if self.steps % cfg.target_update_every == 0:
            soft_update(self.target, self.actor, cfg.tau)
        return {"train/td_loss": td_loss.item(), "train/cql_penalty": penalty.item(), "train/q_values": q_data.mean().item()}

    def q_both(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both critics on ``obs`` ``[B, ...]`` with ``actions`` ``[B, N, A]``: ``[B, N]`` each."""
        b, n = actions.shape[:2]
        q_input = torch.cat([obs.flatten(1).unsqueeze(1).expand(b, n, -1), actions], -1).reshape(b * n, -1)
        return self.q1(q_input).reshape(b, n), self.q2(q_input).reshape(b, n)

    def learn_continuous(self, batch: TensorDict) -> dict[str, float]:
        cfg = self.cfg
        obs, next_obs, action = batch["obs"], batch["next_obs"], batch["action"]
        b, n = obs.shape[0], cfg.n_actions
        alpha = self.log_alpha.exp().detach()

        # The actor and its entropy weight: SAC's.
        pi_action, log_prob, _ = self.actor.sample(obs)
        q1_pi, q2_pi = self.q_both(obs, pi_action.unsqueeze(1))
        actor_loss = (alpha * log_prob - torch.min(q1_pi, q2_pi).squeeze(1)).mean()
        self.actor_optimizer.zero_grad()
        actor_loss.backward()
        self.actor_optimizer.step()
        alpha_loss = -(self.log_alpha.exp() * (log_prob.detach() + self.target_entropy)).mean()
        self.alpha_optimizer.zero_grad()
        alpha_loss.backward()
        self.alpha_optimizer.step()

        # TD targets (no entropy bonus in the backup, as CORL's default).
        with torch.no_grad():
            next_action, _, _ = self.actor.sample(next_obs)
            t1, t2 = (q(torch.cat([next_obs.flatten(1), next_action], -1)).squeeze(-1) for q in (self.q1_target, self.q2_target))
            target = batch["reward"] + (1 - batch["terminated"].float()) * cfg.gamma * torch.min(t1, t2)
        q1_data, q2_data = (q.squeeze(1) for q in self.q_both(obs, action.unsqueeze(1)))
        td_loss = F.mse_loss(q1_data, target) + F.mse_loss(q2_data, target)

        # The conservative penalty over uniform actions and the policy's at s and s'.
        with torch.no_grad():
            repeat = lambda x: x.unsqueeze(1).expand(b, n, *x.shape[1:]).reshape(b * n, *x.shape[1:])  # noqa: E731
            random_actions = self.actor.bounds.random(b * n).reshape(b, n, -1)
            pi_now, logp_now, _ = self.actor.sample(repeat(obs))
            pi_next, logp_next, _ = self.actor.sample(repeat(next_obs))
        sampled = torch.cat([random_actions, pi_now.reshape(b, n, -1), pi_next.reshape(b, n, -1)], 1)
        log_density = torch.cat([torch.full((b, n), self.uniform_log_density), logp_now.reshape(b, n), logp_next.reshape(b, n)], 1)
        q1_sampled, q2_sampled = self.q_both(obs, sampled)
        gap1 = cql_penalty(q1_sampled, log_density, q1_data, cfg.temperature)
        gap2 = cql_penalty(q2_sampled, log_density, q2_data, cfg.temperature)
        if cfg.lagrange:
            alpha_prime = self.log_alpha_prime.exp().clamp(0.0, 1e6)
            penalty = alpha_prime.detach() * cfg.cql_alpha * ((gap1 - cfg.target_action_gap) + (gap2 - cfg.target_action_gap))
            alpha_prime_loss = -alpha_prime * cfg.cql_alpha * ((gap1.detach() - cfg.target_action_gap) + (gap2.detach() - cfg.target_action_gap)) / 2
            self.alpha_prime_optimizer.zero_grad()
            alpha_prime_loss.backward()
            self.alpha_prime_optimizer.step()
        else:
            penalty = cfg.cql_alpha * (gap1 + gap2)
        q_loss = td_loss + penalty
        self.q_optimizer.zero_grad()
        q_loss.backward()
        self.q_optimizer.step()
        if self.steps % cfg.target_update_every == 0:
            soft_update(self.q1_target, self.q1, cfg.tau)
            soft_update(self.q2_target, self.q2, cfg.tau)
        return {"train/td_loss": td_loss.item(), "train/cql_gap": (gap1 + gap2).item() / 2, "train/actor_loss": actor_loss.item(),
                "train/alpha": alpha.item(), "train/alpha_prime": self.log_alpha_prime.exp().item(),
                "train/q1": q1_data.mean().item(), "train/entropy": -log_prob.mean().item()}
