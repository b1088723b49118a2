"""Conservative Q-Learning (Kumar et al. 2020), CQL(H) as CORL's ``cql.py``,
for continuous actions (``algo=cql`` on a discrete action space runs
harness/algos/cql_discrete.py instead: ``CQL.for_spec`` picks).

SAC (tanh-Gaussian actor, twin critics, tuned entropy) whose critics also
push down a soft maximum of Q over sampled actions (uniform ones, and the
policy's at ``s`` and ``s'``, importance-weighted by their densities) and push
up Q on the dataset's actions. With ``lagrange`` the penalty's weight is tuned
so that the gap stays near ``target_action_gap``.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torch import nn
from torch.distributed import ProcessGroup

from harness.algos.base import Algorithm, Policy
from harness.algos.conservative import CQLConfig, cql_penalty
from harness.algos.cql_discrete import DiscreteCQL
from harness.algos.critics import Critics
from harness.algos.nets import LogScalar
from harness.algos.offline import OfflineAlgorithm
from harness.algos.optim import step
from harness.algos.sac import SACPolicy
from harness.collect.envs import EnvSpec

__all__ = ["CQL", "CQLConfig", "DiscreteCQL", "cql_penalty"]


class CQL(OfflineAlgorithm):
    """Continuous CQL's trainer side: SAC's actor, entropy weight and twin
    critics, plus the penalty's Lagrange weight."""

    Config = CQLConfig

    def __new__(cls, cfg: CQLConfig, spec: EnvSpec, *args, **kwargs) -> Algorithm:
        # Transitional, for callers that still build ALGOS[name](...) rather than
        # ALGOS[name].for_spec(spec)(...): CQL(...) on discrete actions is DiscreteCQL(...).
        if spec.discrete:
            return DiscreteCQL(cfg, spec, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, cfg: CQLConfig, spec: EnvSpec, total_frames: int, ddp_group: ProcessGroup | None = None):
        super().__init__(cfg, spec, total_frames, ddp_group)
        self.critics = Critics(spec, cfg.hidden)
        self.q_optimizer = torch.optim.Adam(self.critics.online.parameters(), lr=cfg.critic_lr)
        self.actor_optimizer = torch.optim.Adam(self.policy.parameters(), lr=cfg.actor_lr)
        self.target_entropy = -float(spec.num_actions)
        self.log_alpha = LogScalar(1.0)  # SAC's entropy weight
        self.alpha_optimizer = torch.optim.Adam(self.log_alpha.parameters(), lr=cfg.actor_lr)
        self.alpha_prime = LogScalar(1.0)  # the penalty's Lagrange multiplier
        self.alpha_prime_optimizer = torch.optim.Adam(self.alpha_prime.parameters(), lr=cfg.critic_lr)
        # Uniform actions have density 1 / volume of the action box.
        self.uniform_log_density = -float(torch.log(2 * self.policy.bounds.scale).sum())

    @classmethod
    def for_spec(cls, spec: EnvSpec) -> type[Algorithm]:
        return DiscreteCQL if spec.discrete else cls

    @classmethod
    def make_policy(cls, cfg: CQLConfig, spec: EnvSpec) -> Policy:
        return DiscreteCQL.make_policy(cfg, spec) if spec.discrete else SACPolicy(spec, cfg.hidden)

    def checkpointed(self) -> dict[str, object]:
        return {"policy": self.policy, "critics": self.critics, "log_alpha": self.log_alpha, "alpha_prime": self.alpha_prime,
                "q_optimizer": self.q_optimizer, "actor_optimizer": self.actor_optimizer, "alpha_optimizer": self.alpha_optimizer,
                "alpha_prime_optimizer": self.alpha_prime_optimizer}

    def actor_step(self, obs: torch.Tensor) -> dict[str, float]:
        """SAC's actor and entropy-weight step."""
        alpha = self.log_alpha().detach()
        pi_action, log_prob, _ = self.policy.sample(obs)
        actor_loss = (alpha * log_prob - self.critics(obs, pi_action).min(0).values).mean()
        step(self.actor_optimizer, actor_loss)
        step(self.alpha_optimizer, -(self.log_alpha() * (log_prob.detach() + self.target_entropy)).mean())
        return {"train/actor_loss": actor_loss.item(), "train/alpha": alpha.item(), "train/entropy": -log_prob.mean().item()}

    def sampled_actions(self, obs: torch.Tensor, next_obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``n_actions`` each of uniform actions, pi(s) and pi(s') ``[B, 3N, A]``, and their log densities ``[B, 3N]``."""
        b, n = obs.shape[0], self.cfg.n_actions
        with torch.no_grad():
            repeat = lambda x: x.unsqueeze(1).expand(b, n, *x.shape[1:]).reshape(b * n, *x.shape[1:])  # noqa: E731
            random_actions = self.policy.bounds.random(b * n).reshape(b, n, -1)
            pi_now, logp_now, _ = self.policy.sample(repeat(obs))
            pi_next, logp_next, _ = self.policy.sample(repeat(next_obs))
        sampled = torch.cat([random_actions, pi_now.reshape(b, n, -1), pi_next.reshape(b, n, -1)], 1)
        log_density = torch.cat([torch.full((b, n), self.uniform_log_density), logp_now.reshape(b, n), logp_next.reshape(b, n)], 1)
        return sampled, log_density

    def learn(self, batch: TensorDict) -> dict[str, float]:
        cfg = self.cfg
        obs, next_obs = batch["obs"], batch["next_obs"]
        metrics = self.actor_step(obs)

        # TD targets (no entropy bonus in the backup, as CORL's default).
        with torch.no_grad():
            next_action, _, _ = self.policy.sample(next_obs)
            target = batch["reward"] + (1 - batch["terminated"].float()) * cfg.gamma * self.critics.targets(next_obs, next_action).min(0).values
        q_data = self.critics(obs, batch["action"])  # [2, B]
        td_loss = (q_data - target).pow(2).mean(1).sum()

        # The conservative penalty over uniform actions and the policy's at s and s', per critic.
        sampled, log_density = self.sampled_actions(obs, next_obs)
        gaps = cql_penalty(self.critics(obs, sampled), log_density, q_data, cfg.temperature)  # [2]
        if cfg.lagrange:
            alpha_prime = self.alpha_prime().clamp(0.0, 1e6)
            penalty = alpha_prime.detach() * cfg.cql_alpha * (gaps - cfg.target_action_gap).sum()
            step(self.alpha_prime_optimizer, -alpha_prime * cfg.cql_alpha * (gaps.detach() - cfg.target_action_gap).sum() / 2)
        else:
            penalty = cfg.cql_alpha * gaps.sum()
        step(self.q_optimizer, td_loss + penalty)
        if self.gradient_steps % cfg.target_update_every == 0:
            self.critics.update_targets(cfg.tau)
        return {**metrics, "train/td_loss": td_loss.item(), "train/cql_gap": gaps.mean().item(),
                "train/alpha_prime": self.alpha_prime().item(), "train/q1": q_data[0].mean().item()}
