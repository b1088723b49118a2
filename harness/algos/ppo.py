"""Proximal Policy Optimisation, as CleanRL's ``ppo.py`` and ``ppo_continuous_action.py`` do it.

Clipped surrogate objective, clipped value loss, entropy bonus, GAE,
per-minibatch advantage normalisation, linear learning-rate annealing and
global gradient-norm clipping; for continuous actions a Gaussian with a
state-independent log-std and, as the MuJoCo presets set, observation
normalisation (``algo.normalize_obs``) and reward scaling
(``algo.normalize_reward``; :mod:`harness.algos.normalize`). Collectors run
the actor and record each action's log-probability. On state vectors the
trainer evaluates the critic on the whole round, so only the actor's weights
(and the observation statistics) travel; on images the critic is a value head
on the actor's CNN (CleanRL's Atari ``Agent``) that travels with it, and the
collectors record each frame's value while acting, as CleanRL does.

Frames acted with older versions than the learner's (``collector.mode=async``,
or pipelined rounds) are learnt from with V-trace's targets and advantages in
place of GAE's (``algo.vtrace``; :mod:`harness.algos.vtrace`), and the clipped
ratio is taken against the acting version's log-probabilities: APPO, as
Sample Factory runs it.

With ``algo.memory`` (lstm, gru) the policy (:mod:`harness.algos.ppo_policy`) has a recurrent core
that both heads share, and a round is learnt from in minibatches of whole env sequences, each
replayed from the state its collector recorded (:mod:`harness.algos.memory`).

With normalisation a round is learnt from with the observation statistics
the collectors acted with (the current version's; batches hold raw
observations), so the first minibatch's probability ratio is exactly 1 as
in CleanRL; the round's observations then update the statistics, which
travel with the next version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, cast

import torch
from tensordict import TensorDict
from torch import nn

from harness.algos.base import AlgoConfig, Algorithm, Stateful
from harness.algos.gae import gae
from harness.algos.memory import (
    INITIAL_STATE,
    RecurrentActorCritic,
    check_memory,
    sequences,
    time_major,
)
from harness.algos.nets import network
from harness.algos.normalize import RewardScaler
from harness.algos.optim import adam
from harness.algos.ppo_policy import PPOPolicy
from harness.algos.ranges import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, PROBABILITY, UNIT, ranged
from harness.algos.vtrace import vtrace
from harness.core.specs import EnvSpec


@dataclass
class PPOConfig(AlgoConfig):
    """Defaults are CleanRL's ``ppo.py`` (CartPole)."""

    name: str = "ppo"
    lr: float = ranged(2.5e-4, POSITIVE)  # Adam learning rate at the start of the run
    anneal_lr: bool = True  # decay the learning rate linearly to 0 at collector.total_frames
    gamma: float = ranged(0.99, UNIT)  # discount
    gae_lambda: float = ranged(0.95, PROBABILITY)  # GAE's bias/variance trade-off
    update_epochs: int = ranged(4, AT_LEAST_ONE)  # passes over each round's frames
    num_minibatches: int = ranged(4, AT_LEAST_ONE)  # minibatches per pass
    norm_adv: bool = True  # normalise advantages within each minibatch
    clip_coef: float = ranged(0.2, POSITIVE)  # surrogate clipping range
    clip_vloss: bool = True  # clip the value loss around the old values
    ent_coef: float = ranged(0.01, NON_NEGATIVE)  # entropy bonus weight
    vf_coef: float = ranged(0.5, NON_NEGATIVE)  # value loss weight
    max_grad_norm: float = ranged(0.5, POSITIVE)  # global gradient-norm clip
    # stop the epochs early past this approximate KL
    target_kl: Optional[float] = ranged(None, POSITIVE)
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])  # actor and critic MLP widths
    # none | lstm | gru: a recurrent core after the encoder (hidden_sizes' layers, or the CNN) that
    # the actor's and the critic's heads share, learnt over whole segments (harness/algos/memory.py)
    memory: str = "none"
    memory_size: int = ranged(128, AT_LEAST_ONE)  # the core's units
    # Divide rewards by a running std of the discounted return, per env (gymnasium's
    # NormalizeReward, as CleanRL's ppo_continuous_action.py); sync mode only: it follows each env's
    # rewards in order.
    normalize_reward: bool = False
    # scaled rewards are clipped to [-reward_clip, reward_clip] (CleanRL: 10)
    reward_clip: float = ranged(10.0, POSITIVE)
    # V-trace targets and advantages (IMPALA; APPO with the clipped objective) in place of GAE,
    # correcting for frames acted with older versions. null: on exactly when they are, with
    # collector.mode=async or collector.pipeline=true.
    vtrace: Optional[bool] = None
    # truncation of the importance ratio in the targets and advantages
    vtrace_rho_bar: float = ranged(1.0, POSITIVE)
    # truncation of the ratio in the traces (how far corrections reach back)
    vtrace_c_bar: float = ranged(1.0, POSITIVE)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_memory(self.memory)


class PPOLoss(nn.Module):
    """The PPO objective on one minibatch, as a module so that DDP can wrap it
    when several trainers learn together.

    On images the critic is the actor's value head on its CNN (CleanRL's Atari
    ``Agent``): a minibatch goes through the CNN once, and both losses train it. With memory
    it is the value head on the recurrent core, and a minibatch is whole env sequences
    (:func:`~harness.algos.memory.sequences`), replayed from their recorded states.
    """

    def __init__(
        self, actor: PPOPolicy, critic: Optional[nn.Module], cfg: PPOConfig, obs_dims: int
    ):
        """``critic``: the value network of observations; None where the actor holds a value head
        (images, memory)."""
        super().__init__()
        self.actor, self.critic, self.cfg, self.obs_dims = actor, critic, cfg, obs_dims

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        obs = obs.flatten(-self.obs_dims)
        if self.critic is None:
            return self.actor.value_of(self.actor.net[0](obs))
        return self.critic(obs).float().squeeze(-1)

    def forward(self, mb: TensorDict) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        if self.actor.memory is not None:  # truncated BPTT over each sequence, time first
            mb, state = time_major(mb)
            dist, new_value = self.actor.unroll(mb["obs"], state, mb["done"])
        elif self.critic is None:
            features = self.actor.net[0](mb["obs"].flatten(1))
            dist = self.actor.distribution_of(self.actor.net[1](features))
            new_value = self.actor.value_of(features)
        else:
            dist, new_value = self.actor.distribution(mb["obs"]), self.value(mb["obs"])
        logprob, entropy = self.actor.log_prob_entropy(mb["obs"], mb["action"], dist)
        logratio = logprob - mb["logprob"]
        ratio = logratio.exp()
        with torch.no_grad():
            approx_kl = ((ratio - 1) - logratio).mean()  # http://joschu.net/blog/kl-approx.html
            clipfrac = ((ratio - 1.0).abs() > cfg.clip_coef).float().mean()

        adv = mb["advantage"]
        if cfg.norm_adv:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg_loss = torch.max(
            -adv * ratio, -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)
        ).mean()

        if cfg.clip_vloss:
            clipped = mb["value"] + (new_value - mb["value"]).clamp(-cfg.clip_coef, cfg.clip_coef)
            v_loss = (
                0.5
                * torch.max((new_value - mb["return"]) ** 2, (clipped - mb["return"]) ** 2).mean()
            )
        else:
            v_loss = 0.5 * ((new_value - mb["return"]) ** 2).mean()
        entropy = entropy.mean()
        loss = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
        return {
            "loss": loss,
            "policy_loss": pg_loss,
            "value_loss": v_loss,
            "entropy": entropy,
            "approx_kl": approx_kl,
            "clipfrac": clipfrac,
        }


class PPO(Algorithm[PPOConfig, PPOPolicy]):
    """PPO's trainer side: actor and critic in one loss module, one optimiser."""

    Config = PPOConfig
    data_parallel_trainers = True
    on_policy = True
    takes_pixels = True
    compiled = ("losses",)

    # *args, **kwargs: as Algorithm's
    def __init__(self, cfg: PPOConfig, spec: EnvSpec, *args: Any, **kwargs: Any):
        super().__init__(cfg, spec, *args, **kwargs)
        # On images, and with memory, the actor's value head is the critic.
        shared = spec.pixels or cfg.memory != "none"
        critic = None if shared else network(spec, cfg.hidden_sizes, 1, out_std=1.0).to(self.device)
        self.loss = PPOLoss(self.policy, critic, cfg, len(spec.obs_shape))
        self.learner = self.data_parallel(self.loss)
        self.optimizer = adam(self.loss.parameters(), lr=cfg.lr, eps=1e-5)
        # one kernel for every gradient's norm; meta (device tests) has none
        self.foreach = self.device.type != "meta"
        self.reward_scaler = (
            RewardScaler(cfg.gamma, cfg.reward_clip).to(self.device)
            if cfg.normalize_reward
            else None
        )

    @classmethod
    def make_policy(cls, cfg: PPOConfig, spec: EnvSpec) -> PPOPolicy:
        return PPOPolicy(spec, cfg.hidden_sizes, cfg.memory, cfg.memory_size)

    def checkpointed(self) -> dict[str, Stateful]:
        scaler = {"reward_scaler": self.reward_scaler} if self.reward_scaler is not None else {}
        # the loss module holds actor and critic
        return {"loss": self.loss, "optimizer": self.optimizer, **scaler}

    def losses(self, mb: TensorDict) -> dict[str, torch.Tensor]:
        """The PPO objective and its parts on minibatch ``mb`` (through DDP with several
        trainers)."""
        return self.learner(mb)

    @torch.no_grad()
    def targets(
        self,
        obs: torch.Tensor,
        rollout: TensorDict,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        initial_state: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The critic's values, the advantages and the value targets of a ``[T, N]`` rollout (GAE,
        or V-trace), and the share of frames whose probability ratio V-trace truncated (0 with GAE).
        GAE takes the values recorded while acting where there are (images: saving the CNN a pass
        over the round); V-trace, the current critic's; with memory, the recurrent forward's from
        each env's ``initial_state``."""
        cfg = self.cfg
        logprob = None
        if initial_state is not None:
            values, next_value, logprob = self.replay(obs, rollout, initial_state, next_obs)
        else:
            acted = self.policy.value_head is not None and not cfg.vtrace
            values = rollout["value"] if acted else self.loss.value(obs)
            next_value = self.loss.value(self.normalized(next_obs))
        if not cfg.vtrace:
            advantages = gae(reward, values, rollout["done"], next_value, cfg.gamma, cfg.gae_lambda)
            return values, advantages, advantages + values, torch.zeros((), device=values.device)
        # The frames' versions may be older than these weights: correct by each action's probability
        # ratio.
        if logprob is None:
            flat_obs, flat_action = obs.flatten(0, 1), rollout["action"].flatten(0, 1)
            logprob = self.policy.log_prob_entropy(flat_obs, flat_action)[0].view(reward.shape)
        log_ratio = logprob - rollout["logprob"]
        done, lam = rollout["done"], cfg.gae_lambda
        rho_bar, c_bar = cfg.vtrace_rho_bar, cfg.vtrace_c_bar
        returns, advantages = vtrace(
            log_ratio, reward, values, done, next_value, cfg.gamma, lam, rho_bar, c_bar
        )
        return values, advantages, returns, (log_ratio.exp() > rho_bar).float().mean()

    @torch.no_grad()
    def replay(
        self, obs: torch.Tensor, rollout: TensorDict, state: torch.Tensor, next_obs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """With memory: a ``[T, N]`` round's values and log-probabilities by the recurrent forward
        from each env's recorded ``state``, and the value of ``next_obs`` from the state after the
        round. In async mode an older version made those states: they are used as they are (no
        burn-in recomputes them; docs/algorithms.md, "Policies with memory")."""
        done = rollout["done"]  # next_obs: one more step, from a state zeroed where done[-1]
        steps = torch.cat([obs, self.normalized(next_obs).unsqueeze(0)])
        out, values = cast(RecurrentActorCritic, self.policy.memory).unroll(
            steps.flatten(2), state, torch.cat([done, done[-1:]])
        )
        dist = self.policy.distribution_of(out[:-1])
        logprob = self.policy.log_prob_entropy(obs, rollout["action"], dist)[0]
        return values[:-1], values[-1], logprob

    def update(self, batches: list[TensorDict], frames: int) -> dict[str, torch.Tensor | float]:
        # [T, N], [N, ...], with memory [N, state]
        rollout, next_obs, initial_state = self.round_on_device(batches)
        obs = self.normalized(rollout["obs"])  # with the statistics the collectors acted with
        reward = rollout["reward"]
        if self.reward_scaler is not None:
            reward = self.reward_scaler.scale(reward, rollout["terminated"], self.ddp_group)
        values, advantages, returns, ratio_clipped = self.targets(
            obs, rollout, reward, next_obs, initial_state
        )
        frames_ = rollout.select("action", "logprob").set("obs", obs).set("value", values)
        frames_.set("advantage", advantages).set("return", returns)
        if initial_state is None:
            data = frames_.reshape(-1)  # single frames
        else:  # minibatches of whole env sequences: truncated BPTT from their recorded states
            data = sequences(frames_.set("done", rollout["done"]), initial_state)
        lr = self.set_learning_rate(frames)
        history = self.epochs(data)

        # the next version's statistics: every trainer's frames of this round
        if self.obs_norm is not None:
            self.obs_norm.update(rollout["obs"], self.ddp_group)
        return self.round_metrics(history, values, returns, lr, ratio_clipped)

    def round_on_device(
        self, batches: list[TensorDict]
    ) -> tuple[TensorDict, torch.Tensor, Optional[torch.Tensor]]:
        """The round's fields the update reads (``rollout`` ``[T, N]``, ``next_obs`` ``[N, ...]``,
        with memory ``initial_state`` ``[N, S]``), moved to the trainer's device once: on a GPU,
        through pinned memory, without blocking."""
        # terminated: the reward scaler's episode ends; value: recorded while acting, on images
        keys = ["obs", "action", "logprob", "reward", "done", "terminated"]
        keys += ["value"] if self.policy.value_head is not None else []
        # torch.cat of TensorDicts dispatches to tensordict's (torch's stub says Tensor).
        frames_of_round = TensorDict(
            rollout=torch.cat([b["rollout"].select(*keys) for b in batches], dim=1),
            next_obs=torch.cat([b["next_obs"] for b in batches], dim=0),
        )
        if self.policy.memory is not None:
            frames_of_round[INITIAL_STATE] = torch.cat([b[INITIAL_STATE] for b in batches], dim=0)
        moved = self.to_device.move(frames_of_round)
        return cast(TensorDict, moved["rollout"]), moved["next_obs"], moved.get(INITIAL_STATE)

    def set_learning_rate(self, frames: int) -> float:
        """Sets the optimiser's learning rate for a round that starts at ``frames``, and returns it:
        linearly down to 0 at ``total_frames`` with ``algo.anneal_lr``, else ``algo.lr``."""
        cfg = self.cfg
        lr = cfg.lr * (1.0 - frames / self.total_frames) if cfg.anneal_lr else cfg.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def epochs(self, data: TensorDict) -> list[dict[str, torch.Tensor]]:
        """``algo.update_epochs`` passes over the round's ``data`` (single frames, or with memory
        env sequences) in random minibatches, or fewer past ``algo.target_kl``; each step's losses,
        detached."""
        cfg = self.cfg
        size = data.shape[0]
        minibatch = max(size // cfg.num_minibatches, 1)
        history = []
        for _ in range(cfg.update_epochs):
            for idx in torch.randperm(size, device=data.device).split(minibatch):
                history.append(self.minibatch_step(data[idx]))
            if (
                cfg.target_kl is not None
                and self.mean_over_trainers(history[-1]["approx_kl"]) > cfg.target_kl
            ):
                # on the trainers' mean KL: each's own minibatch differs, and all must stop together
                break
        return history

    def minibatch_step(self, mb: TensorDict) -> dict[str, torch.Tensor]:
        """One optimiser step on minibatch ``mb``, gradient norm clipped; returns its losses."""
        with self.autocast():
            out = self.losses(mb)
        self.optimizer.zero_grad()
        out["loss"].backward()
        nn.utils.clip_grad_norm_(
            self.loss.parameters(), self.cfg.max_grad_norm, foreach=self.foreach
        )
        self.optimizer.step()
        self.gradient_steps += 1
        return {k: v.detach() for k, v in out.items()}

    def round_metrics(
        self,
        history: list[dict[str, torch.Tensor]],
        values: torch.Tensor,
        returns: torch.Tensor,
        lr: float,
        ratio_clipped: torch.Tensor,
    ) -> dict[str, torch.Tensor | float]:
        """The round's log row: the last step's losses, the clip fraction over every step, how much
        of the returns' variance the values explain."""
        last = history[-1]  # tensors: read once per log row, not once per update
        var_returns = returns.var()
        explained_var = torch.where(
            var_returns == 0, float("nan"), 1 - (returns - values).var() / var_returns
        )
        scaler = self.reward_scaler
        return {
            "train/policy_loss": last["policy_loss"],
            "train/value_loss": last["value_loss"],
            "train/entropy": last["entropy"],
            "train/approx_kl": last["approx_kl"],
            "train/clipfrac": torch.stack([h["clipfrac"] for h in history]).mean(),
            "train/explained_variance": explained_var,
            "train/lr": lr,
            **({"train/return_std": scaler.return_stats.var.sqrt()} if scaler is not None else {}),
            **({"train/vtrace_rho_clipped": ratio_clipped} if self.cfg.vtrace else {}),
        }
