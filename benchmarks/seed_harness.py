"""The harness's side of ``benchmarks/seed_table.py``, and its table: TorchRL's benchmark cases
(0.14.1's ``benchmarks/test_objectives_benchmarks.py`` and ``test_replaybuffer_benchmark.py``) run
on the harness's own code, under the case names of the TorchRL side (seed_torchrl.py).

Losses: the harness has no loss module to call; a learner's ``learn`` interleaves each loss with its
optimiser step. ``forward`` here is the losses one ``learn`` step computes, built from the
algorithm's own loss methods (``td_loss``, ``critic_loss``, ``value_loss``, ``actor_loss``,
``critic_losses``, ``losses``, ``policy.sample``, ``critics``) with no optimiser step and no target
update; the few lines ``learn`` writes inline around its optimiser steps (SAC's, TD3's and CQL's
actor losses, SAC's and CQL's entropy-weight losses) are repeated below, and the actor loss runs
every step, as TorchRL's loss computes it. ``fwd+bwd`` is that, summed, and one ``backward`` (the
gradients zeroed before each call, untimed, as TorchRL's ``setup=loss.zero_grad``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from tensordict import TensorDict

from harness.algos import algorithm_for
from harness.algos.gae import gae
from harness.algos.replay import ReplayBuffer
from harness.algos.vtrace import vtrace
from harness.core.specs import EnvSpec

Call = Callable[[], object]
Case = tuple[Call, Call | None]  # the timed call, and what runs untimed before each call

# TorchRL's objective benchmarks: 8 observation dims, 4 action dims, batch 128 (PPO and IQL: 128 x
# 10). Its networks are a 128-wide trunk of depth 3 to 64 features, shared by actor and critics,
# then 2 layers of 128 per head: about 67k multiply-adds per sample per network. The harness's
# two-hidden-layer networks reach the same count at 256 wide (its default width), and PPO's and
# DQN's configurable widths take TorchRL's layers as they are.
OBS, ACT, BATCH, LONG_BATCH = 8, 4, 128, 128 * 10
CONTINUOUS = EnvSpec((OBS,), False, (ACT,), ACT, (-1.0,) * ACT, (1.0,) * ACT)
DISCRETE = EnvSpec((OBS,), True, (), ACT)
WIDTHS: dict[str, dict[str, Any]] = {
    "dqn": {"hidden_sizes": (128, 128, 128)},
    "ppo": {"hidden_sizes": [128, 128, 128, 64, 128, 128]},
    **{name: {"hidden": 256} for name in ("sac", "td3", "cql", "iql")},
}

# Where a row's two sides do different work, for the table. "Action at the head": TorchRL's
# Q-networks take the action after their trunk, the harness's with the observation at the first
# layer, so an actor loss's gradient to the action crosses every harness critic layer and only
# TorchRL's head.
NOTES = {
    "value/gae": "both vectorised: harness a doubling scan over [T, N] (harness/algos/scan.py); "
    "TorchRL splits episodes, pads them and convolves with a geometric kernel (its MACs)",
    "value/vtrace": "not in TorchRL's benchmark files: TorchRL's vtrace_advantage_estimate, a "
    "Python loop over time, at test_gae_speed's shapes; harness lam=1 (TorchRL has none)",
    "loss/dqn": "same layers (8-128-128-128-4); harness ReLU, TorchRL Tanh; harness action "
    "indices, TorchRL one-hot actions",
    "loss/sac": "passes: harness 3 actor (one more for the entropy-weight loss, as its learn "
    "does) and 6 critic, TorchRL 2 and 6; action at the head",
    "loss/td3": "passes: harness 2 actor and 5 critic (actor loss on critic 1), TorchRL 2 and 6 "
    "(its actor loss runs both critics, uses the first); action at the head",
    "loss/cql": "harness runs the actor once per observation for its 10 sampled actions (TorchRL "
    "once per action), Q on the data's and sampled actions in one call; TorchRL's critic "
    "losses stop at the trunk its Q-networks share with the actor; action at the head",
    "loss/ppo": "same layers (8-128-128-128-64-128-128) for actor and critic, the harness's "
    "unshared (TorchRL's share the trunk, run once per network); "
    "harness Normal (state-independent std), TorchRL TanhNormal (Monte-Carlo entropy); harness "
    "also normalises advantages and clips the value loss",
    "loss/iql": "passes: harness 7 (the actor's advantage is the value loss's), TorchRL 10 (its "
    "actor loss runs the target critics and V again); harness Gaussian actor, TorchRL "
    "TanhNormal",
    "replay/sample": "256 of 10,000 (a: 5 floats, b.c: 3x32x32 uint8), uniform with "
    "replacement; TorchRL TensorDictReplayBuffer, RandomSampler",
    "replay/populate": "test_rb_populate's timing: TorchRL writes 400 into an empty buffer of "
    "400 made untimed (its lazy storage allocates at the write); the harness's buffer allocates "
    "when built, so its build is timed",
    "replay/build_populate": "build an empty buffer of 400 and write 400 into it, both "
    "sides timed alike (not one of TorchRL's cases)",
    "replay/extend_sample": "100 x (extend 10,000 x 1 float, sample 3); one buffer per side, "
    "reused across calls (TorchRL's test makes a fresh one per round)",
}


def note_for(case: str) -> str:
    """The longest ``NOTES`` key that ``case`` starts with, or ''."""
    keys = [k for k in NOTES if case.startswith(k + "/") or case == k]
    return NOTES[max(keys, key=len)] if keys else ""


def value_cases() -> dict[str, Case]:
    """GAE at TorchRL's test_gae_speed shapes (1 and 32 sequences of 512) and test_values' (300 of
    500); V-trace at the first two."""
    cases: dict[str, Case] = {}
    for n, t, gamma in ((1, 512, 0.99), (32, 512, 0.99), (300, 500, 0.95)):
        torch.manual_seed(0)
        reward, value, next_value = torch.randn(t, n), torch.randn(t, n), torch.randn(n)
        done = torch.zeros(t, n, dtype=torch.bool).bernoulli_(0.1)
        log_ratio = 0.1 * torch.randn(t, n)
        cases[f"value/gae/{n}x{t}"] = (
            partial(gae, reward, value, done, next_value, gamma, 0.95),
            None,
        )
        if t == 512:
            cases[f"value/vtrace/{n}x{t}"] = (
                partial(vtrace, log_ratio, reward, value, done, next_value, 0.99, 1.0, 1.0, 1.0),
                None,
            )
    return cases


def transitions(n: int, discrete: bool) -> TensorDict:
    return TensorDict(
        obs=torch.randn(n, OBS),
        next_obs=torch.randn(n, OBS),
        action=torch.randint(0, ACT, (n,)) if discrete else torch.rand(n, ACT) * 2 - 1,
        reward=torch.randn(n),
        terminated=torch.zeros(n, dtype=torch.bool),
        batch_size=[n],
    )


def sac_losses(algo: Any, batch: TensorDict) -> torch.Tensor:
    """SAC's critic, actor and entropy-weight losses, as one ``learn`` step with an actor update
    computes them."""
    q_loss, _ = algo.critic_loss(batch)
    action, log_prob, _ = algo.policy.sample(batch["obs"])
    q_pi = algo.critics(batch["obs"], action, frozen=True).min(0).values
    actor_loss = (algo.alpha * log_prob - q_pi).mean()
    with torch.no_grad():
        _, log_prob, _ = algo.policy.sample(batch["obs"])
    alpha_loss = (-algo.log_alpha() * (log_prob + algo.target_entropy)).mean()
    return q_loss + actor_loss + alpha_loss


def td3_losses(algo: Any, batch: TensorDict) -> torch.Tensor:
    """TD3's critic loss and its (delayed, here every step) actor loss."""
    q_loss, _ = algo.critic_loss(batch)
    action = algo.policy.deterministic(batch["obs"])
    return q_loss - algo.critics(batch["obs"], action, members=1, frozen=True).mean()


def iql_losses(algo: Any, batch: TensorDict) -> torch.Tensor:
    """IQL's value, critic and actor losses, as ``learn`` computes them."""
    obs, action = batch["obs"], batch["action"]
    with torch.no_grad():
        next_v = algo.value(batch["next_obs"]).float().squeeze(-1)
    value_loss, advantage = algo.value_loss(obs, action)
    q_loss, _ = algo.critic_loss(batch, next_v)
    actor_loss, _ = algo.actor_loss(obs, action, advantage.detach())
    return value_loss + q_loss + actor_loss


def cql_losses(algo: Any, batch: TensorDict) -> torch.Tensor:
    """CQL's actor and entropy-weight losses (``actor_step``'s, past behaviour cloning), and the
    critics' TD loss plus the conservative penalty (``critic_losses``; no Lagrange weight)."""
    obs = batch["obs"]
    alpha = algo.log_alpha().detach()
    pi_action, log_prob, _ = algo.policy.sample(obs)
    actor_loss = (alpha * log_prob - algo.critics(obs, pi_action, frozen=True).min(0).values).mean()
    alpha_loss = -(algo.log_alpha() * (log_prob.detach() + algo.target_entropy)).mean()
    td_loss, gaps, _, _ = algo.critic_losses(batch)
    return actor_loss + alpha_loss + td_loss + algo.cfg.cql_alpha * gaps.sum()


def ppo_minibatch(n: int) -> TensorDict:
    return TensorDict(
        obs=torch.randn(n, OBS),
        action=torch.randn(n, ACT),
        logprob=torch.randn(n),
        advantage=torch.randn(n),
        value=torch.randn(n),
        batch_size=[n],
    ).set("return", torch.randn(n))


LOSSES: dict[str, tuple[EnvSpec, int, Callable[[Any, TensorDict], torch.Tensor]]] = {
    "dqn": (DISCRETE, BATCH, lambda algo, batch: algo.td_loss(batch)[0]),
    "sac": (CONTINUOUS, BATCH, sac_losses),
    "td3": (CONTINUOUS, BATCH, td3_losses),
    "cql": (CONTINUOUS, BATCH, cql_losses),
    "ppo": (CONTINUOUS, LONG_BATCH, lambda algo, mb: algo.losses(mb)["loss"]),
    "iql": (CONTINUOUS, LONG_BATCH, iql_losses),
}


def loss_cases() -> dict[str, Case]:
    """Each algorithm's ``forward`` and ``fwd+bwd`` (module docstring), eager."""
    cases: dict[str, Case] = {}
    for name, (spec, n, losses) in LOSSES.items():
        torch.manual_seed(0)
        cls = algorithm_for(name, spec)
        algo = cls(cls.Config(compile=False, **WIDTHS[name]), spec, 10**6)
        data = ppo_minibatch(n) if name == "ppo" else transitions(n, spec.discrete)
        optimizers = [o for o in vars(algo).values() if isinstance(o, torch.optim.Optimizer)]

        def zero_grad(optimizers: list[torch.optim.Optimizer] = optimizers) -> None:
            for optimizer in optimizers:
                optimizer.zero_grad()

        def forward_backward(
            algo: Any = algo, data: TensorDict = data, losses: Any = losses
        ) -> None:
            losses(algo, data).backward()

        cases[f"loss/{name}/forward"] = (partial(losses, algo, data), None)
        cases[f"loss/{name}/fwd+bwd"] = (forward_backward, zero_grad)
    return cases


def replay_cases() -> dict[str, Case]:
    """TorchRL's test_rb_sample, test_rb_populate and test_rb_extend_sample (eager) on
    ``ReplayBuffer``: uniform sampling with replacement, the harness's only kind."""

    def frames(size: int) -> TensorDict:
        return TensorDict(
            {
                "a": torch.zeros(size, 5),
                ("b", "c"): torch.zeros(size, 3, 32, 32, dtype=torch.uint8),
            },
            batch_size=[size],
        )

    data = frames(10_000)
    cases: dict[str, Case] = {}
    memmap_dir = tempfile.TemporaryDirectory(prefix="seed-table-")
    for kind, where in (("tensor", None), ("memmap", memmap_dir.name)):
        buffer = ReplayBuffer(10_000, data[0], memmap_dir=where)
        buffer.extend(data)
        cases[f"replay/sample/{kind}/10000"] = (partial(buffer.sample, 256), None)
    few = frames(400)

    def populate() -> None:
        ReplayBuffer(400, few[0]).extend(few)

    # the harness's buffer allocates when built: both rows build it inside the timing
    cases["replay/populate/tensor/400"] = (populate, None)
    cases["replay/build_populate/tensor/400"] = (populate, None)
    column = TensorDict(x=torch.randn(10_000, 1), batch_size=[10_000])
    for size in (10_000, 100_000, 1_000_000):
        buffer = ReplayBuffer(size, column[0])

        def extend_sample(b: ReplayBuffer = buffer) -> None:
            for _ in range(100):
                b.extend(column)
                b.sample(3)

        cases[f"replay/extend_sample/{size}"] = (extend_sample, None)
    KEEP.append(memmap_dir)
    return cases


# What the cases read and nothing else holds (the memmap buffer's directory), for the process's
# lifetime: removed at exit.
KEEP: list[object] = []


def harness_cases() -> dict[str, Case]:
    """Every case of the harness's side, in table order."""
    return {**value_cases(), **loss_cases(), **replay_cases()}


def table(rows: list[dict], with_peer: bool) -> str:
    """The rows as a Markdown table: ms per call, multiply-adds per call (M: millions)."""

    def ms(row: dict, key: str) -> str:
        return f"{row[key]:.3g}" if key in row else "-"

    def macs(row: dict, key: str) -> str:
        return f"{row[key] / 1e6:.2f}M" if row.get(key) else ("0" if key in row else "-")

    if not with_peer:
        lines = ["| case | harness ms | harness MACs | note |", "| --- | ---: | ---: | --- |"]
        lines += [
            f"| {r['case']} | {ms(r, 'harness_ms')} | {macs(r, 'harness_macs')} | {r['note']} |"
            for r in rows
        ]
        return "\n".join(lines)
    lines = [
        "| case | harness ms | TorchRL ms | TorchRL / harness (quartiles) | harness MACs "
        "| TorchRL MACs | note |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        low, high = r.get("ratio_quartiles", (0, 0))
        ratio = f"{r['ratio']:.2f}x ({low:.2f}-{high:.2f})" if "ratio" in r else "-"
        lines.append(
            f"| {r['case']} | {ms(r, 'harness_ms')} | {ms(r, 'torchrl_ms')} | {ratio} | "
            f"{macs(r, 'harness_macs')} | {macs(r, 'torchrl_macs')} | {r['note']} |"
        )
    return "\n".join(lines)
