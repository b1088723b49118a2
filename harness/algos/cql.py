"""Conservative Q-Learning (Kumar et al. 2020), CQL(H) as CORL's ``cql.py``,
for continuous actions (``algo=cql`` on a discrete action space runs
harness/algos/cql_discrete.py instead: ``harness.algos.algorithm_for`` picks).

SAC (tanh-Gaussian actor, twin critics, tuned entropy) whose critics also
push down a soft maximum of Q over sampled actions (uniform ones, and the
policy's at ``s`` and ``s'``, importance-weighted by their densities) and push
up Q on the dataset's actions. With ``lagrange`` the penalty's weight is tuned
so that the gap stays near ``target_action_gap``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from tensordict import TensorDict

from harness.algos.base import Policy, Stateful, require_actions
from harness.algos.conservative import CQLConfig, cql_penalty
from harness.algos.cql_discrete import DiscreteCQL
from harness.algos.critics import Critics
from harness.algos.nets import LogScalar
from harness.algos.offline import OfflineAlgorithm
from harness.algos.optim import adam, step
from harness.algos.sac import SACPolicy
from harness.core.specs import EnvSpec

__all__ = ["CQL", "CQLConfig", "DiscreteCQL", "cql_penalty"]


class CQL(OfflineAlgorithm[CQLConfig, Policy]):
    """Continuous CQL's trainer side: SAC's actor, entropy weight and twin
    critics, plus the penalty's Lagrange weight."""

    Config = CQLConfig
    compiled = ("critic_losses",)
    # 0.84x the eager step; its ~30 s of compiling paid back within 1k steps (docs/algorithms.md)
    compile_by_default = True
    policy: SACPolicy

    # *args, **kwargs: as Algorithm's
    def __init__(self, cfg: CQLConfig, spec: EnvSpec, *args: Any, **kwargs: Any):
        super().__init__(cfg, spec, *args, **kwargs)
        # The critics' side: twin critics, and the penalty's Lagrange multiplier.
        self.critics = Critics(spec, cfg.hidden).to(self.device)
        self.q_optimizer = adam(self.critics.online.parameters(), lr=cfg.critic_lr)
        self.alpha_prime = LogScalar(1.0).to(self.device)
        self.alpha_prime_optimizer = adam(self.alpha_prime.parameters(), lr=cfg.critic_lr)
        # The actor's side, SAC's: the actor and its entropy weight.
        self.actor_optimizer = adam(self.policy.parameters(), lr=cfg.actor_lr)
        self.log_alpha = LogScalar(1.0).to(self.device)
        self.alpha_optimizer = adam(self.log_alpha.parameters(), lr=cfg.actor_lr)
        self.target_entropy = -float(spec.num_actions)
        # Uniform actions have density 1 / volume of the action box (from the spec: a number, not a
        # device read).
        self.uniform_log_density = -sum(
            math.log(high - low) for low, high in zip(spec.action_low, spec.action_high)
        )

    @classmethod
    def make_policy(cls, cfg: CQLConfig, spec: EnvSpec) -> Policy:
        require_actions(
            spec,
            False,
            "continuous CQL needs continuous actions; algo=cql on discrete ones is discrete CQL",
        )
        return SACPolicy(spec, cfg.hidden)

    def checkpointed(self) -> dict[str, Stateful]:
        return {
            "policy": self.policy,
            "critics": self.critics,
            "log_alpha": self.log_alpha,
            "alpha_prime": self.alpha_prime,
            "q_optimizer": self.q_optimizer,
            "actor_optimizer": self.actor_optimizer,
            "alpha_optimizer": self.alpha_optimizer,
            "alpha_prime_optimizer": self.alpha_prime_optimizer,
        }

    def actor_step(self, obs: torch.Tensor, data_action: torch.Tensor) -> dict[str, torch.Tensor]:
        """SAC's actor and entropy-weight step; for the first ``bc_steps``, behaviour cloning in
        place of Q."""
        alpha = self.log_alpha().detach()
        pi_action, log_prob, _ = self.policy.sample(obs)
        if self.gradient_steps <= self.cfg.bc_steps:
            objective = self.policy.log_prob(obs, data_action)
        else:
            # the gradient reaches the actor only
            objective = self.critics(obs, pi_action, frozen=True).min(0).values
        actor_loss = (alpha * log_prob - objective).mean()
        step(self.actor_optimizer, actor_loss)
        step(
            self.alpha_optimizer,
            -(self.log_alpha() * (log_prob.detach() + self.target_entropy)).mean(),
        )
        return {
            "train/actor_loss": actor_loss.detach(),
            "train/alpha": alpha,
            "train/entropy": -log_prob.detach().mean(),
        }

    def sampled_actions(
        self, obs: torch.Tensor, next_obs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For the penalty, ``n_actions`` each of uniform actions, pi(s) and pi(s'), ``[B, 3N, A]``,
        and their log densities ``[B, 3N]``; and one more pi(s') ``[B, A]`` for the TD target. The
        actor runs once per observation (``sample(obs, n)``)."""
        b, n = obs.shape[0], self.cfg.n_actions
        with torch.no_grad():
            random_actions = self.policy.bounds.random(b * n).reshape(b, n, -1)
            pi_now, logp_now, _ = self.policy.sample(obs, n)
            pi_next, logp_next, _ = self.policy.sample(next_obs, n + 1)
        sampled = torch.cat([random_actions, pi_now, pi_next[:, 1:]], 1)
        uniform = torch.full((b, n), self.uniform_log_density, device=obs.device)
        return sampled, torch.cat([uniform, logp_now, logp_next[:, 1:]], 1), pi_next[:, 0]

    def critic_losses(
        self, batch: TensorDict
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Both critics' TD loss, each critic's conservative gap ``[2]``, Q on the dataset's actions
        ``[2, B]``, and diagnostics: mean Q on the uniform and the pi(s) samples, mean TD target."""
        obs, next_obs = batch["obs"], batch["next_obs"]
        sampled, log_density, next_action = self.sampled_actions(obs, next_obs)
        # TD targets (no entropy bonus in the backup, as CORL's default).
        next_q = self.critics.targets(next_obs, next_action).min(0).values
        target = batch["reward"] + (1 - batch["terminated"].float()) * self.cfg.gamma * next_q
        # Both critics on the dataset's action and every sampled one, in one call: [2, B, 1 + 3N].
        q = self.critics(obs, torch.cat([batch["action"].unsqueeze(1), sampled], 1))
        q_data = q[..., 0]
        td_loss = (q_data - target).pow(2).mean(1).sum()
        # The conservative penalty over uniform actions and the policy's at s and s', per critic.
        n = self.cfg.n_actions
        weights = torch.softmax((q[..., 1:].detach() - log_density) / self.cfg.temperature, -1)
        diagnostics = {
            "train/q_random": q[..., 1 : 1 + n].detach().mean(),
            "train/q_policy": q[..., 1 + n : 1 + 2 * n].detach().mean(),
            "train/target_q": target.mean(),
            "train/policy_share": weights[..., n:].sum(-1).mean(),
        }
        return (
            td_loss,
            cql_penalty(q[..., 1:], log_density, q_data, self.cfg.temperature),
            q_data,
            diagnostics,
        )

    def learn(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        metrics = self.actor_step(batch["obs"], batch["action"])
        td_loss, gaps, q_data, diagnostics = self.critic_losses(batch)
        if cfg.lagrange:
            alpha_prime = self.alpha_prime().clamp(0.0, 1e6)
            penalty = alpha_prime.detach() * cfg.cql_alpha * (gaps - cfg.target_action_gap).sum()
            step(
                self.alpha_prime_optimizer,
                -alpha_prime * cfg.cql_alpha * (gaps.detach() - cfg.target_action_gap).sum() / 2,
            )
        else:
            penalty = cfg.cql_alpha * gaps.sum()
        step(self.q_optimizer, td_loss + penalty)
        if self.gradient_steps % cfg.target_update_every == 0:
            self.critics.update_targets(cfg.tau)
        return {
            **metrics,
            **diagnostics,
            "train/td_loss": td_loss.detach(),
            "train/cql_gap": gaps.detach().mean(),
            "train/alpha_prime": self.alpha_prime().detach(),
            "train/q1": q_data[0].detach().mean(),
        }
