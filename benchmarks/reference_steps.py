"""Each update step as a single-file implementation writes it: CleanRL's
``sac_continuous_action.py``, ``td3_continuous_action.py`` and ``dqn.py``,
CORL's ``iql.py`` and ``cql.py``, at the harness's default hyper-parameters and
Pendulum-v1 / CartPole-v1 shapes. Separate critic modules, default Adam,
``.item()`` after each step, a Python loop for the Polyak update: the yardstick
``benchmarks/update.py`` times the harness's steps against (``reference/<algo>``).

Each ``reference_<algo>(batch, device)`` builds its networks and returns one
gradient step on ``batch``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn

Step = Callable[[], None]


def descend(opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    opt.zero_grad()
    loss.backward()
    opt.step()


def q_net(inputs: int, outputs: int = 1, hidden: tuple[int, int] = (256, 256)) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(inputs, hidden[0]),
        nn.ReLU(),
        nn.Linear(*hidden),
        nn.ReLU(),
        nn.Linear(hidden[1], outputs),
    )


def polyak(tau: float, *pairs: tuple[nn.Module, nn.Module]) -> None:
    for target, source in pairs:
        for t, s in zip(target.parameters(), source.parameters()):
            t.data.copy_(tau * s.data + (1 - tau) * t.data)


class Actor(nn.Module):
    """CleanRL's ``sac_continuous_action.Actor`` (Pendulum's action box: scale 2)."""

    def __init__(self, obs: int, act: int):
        super().__init__()
        self.fc1, self.fc2, self.fc_mean, self.fc_logstd = (
            nn.Linear(obs, 256),
            nn.Linear(256, 256),
            nn.Linear(256, act),
            nn.Linear(256, act),
        )

    def get_action(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.relu(self.fc2(F.relu(self.fc1(x))))
        mean, log_std = self.fc_mean(x), torch.tanh(self.fc_logstd(x))
        normal = torch.distributions.Normal(mean, (-5 + 3.5 * (log_std + 1)).exp())
        x_t = normal.rsample()
        y_t = torch.tanh(x_t)
        return y_t * 2, (normal.log_prob(x_t) - torch.log(2 * (1 - y_t.pow(2)) + 1e-6)).sum(
            1, keepdim=True
        )


def parts(d: TensorDict, device: str, q_lr: float = 3e-4) -> SimpleNamespace:
    """The batch's tensors, a SAC actor, twin critics with targets and their Adam, as CleanRL names
    them."""
    obs, act = d["obs"].shape[1], d["action"].shape[1]
    n = SimpleNamespace(
        o=d["obs"],
        a=d["action"],
        r=d["reward"],
        o2=d["next_obs"],
        done=d["terminated"].float(),
        step=0,
        actor=Actor(obs, act).to(device),
        qf1=q_net(obs + act).to(device),
        qf2=q_net(obs + act).to(device),
        log_alpha=torch.zeros(1, requires_grad=True, device=device),
    )
    n.qf1_t, n.qf2_t = copy.deepcopy(n.qf1), copy.deepcopy(n.qf2)
    n.q_opt = torch.optim.Adam([*n.qf1.parameters(), *n.qf2.parameters()], lr=q_lr)
    return n


def twin_mse(n: SimpleNamespace, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(n.qf1(x).view(-1), target) + F.mse_loss(n.qf2(x).view(-1), target)


def sac_actor_loss(
    n: SimpleNamespace, alpha: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    pi, log_pi = n.actor.get_action(n.o)
    xp = torch.cat([n.o, pi], 1)
    return (alpha * log_pi - torch.min(n.qf1(xp), n.qf2(xp))).mean(), log_pi


def reference_sac(d: TensorDict, device: str) -> Step:
    n = parts(d, device, q_lr=1e-3)
    a_opt, alpha_opt, alpha = (
        torch.optim.Adam(n.actor.parameters(), lr=3e-4),
        torch.optim.Adam([n.log_alpha], lr=1e-3),
        [1.0],
    )

    def step() -> None:
        n.step += 1
        with torch.no_grad():
            a2, logp2 = n.actor.get_action(n.o2)
            x2 = torch.cat([n.o2, a2], 1)
            next_q = n.r + (1 - n.done) * 0.99 * (
                torch.min(n.qf1_t(x2), n.qf2_t(x2)) - alpha[0] * logp2
            ).view(-1)
        qf_loss = twin_mse(n, torch.cat([n.o, n.a], 1), next_q)
        descend(n.q_opt, qf_loss)
        if n.step % 2 == 0:
            for _ in range(2):
                actor_loss, _ = sac_actor_loss(n, alpha[0])
                descend(a_opt, actor_loss)
                with torch.no_grad():
                    _, log_pi = n.actor.get_action(n.o)
                descend(alpha_opt, (-n.log_alpha.exp() * (log_pi - 1.0)).mean())
                alpha[0] = n.log_alpha.exp().item()
            actor_loss.item()
        polyak(0.005, (n.qf1_t, n.qf1), (n.qf2_t, n.qf2))
        qf_loss.item()

    return step


def reference_td3(d: TensorDict, device: str) -> Step:
    n = parts(d, device)
    actor = q_net(n.o.shape[1], n.a.shape[1]).to(device)
    actor_t, a_opt = copy.deepcopy(actor), torch.optim.Adam(actor.parameters(), lr=3e-4)

    def step() -> None:
        n.step += 1
        with torch.no_grad():
            a2 = (
                torch.tanh(actor_t(n.o2)) * 2 + (torch.randn_like(n.a) * 0.2).clamp(-0.5, 0.5) * 2
            ).clamp(-2, 2)
            x2 = torch.cat([n.o2, a2], 1)
            next_q = n.r + (1 - n.done) * 0.99 * torch.min(n.qf1_t(x2), n.qf2_t(x2)).view(-1)
        qf_loss = twin_mse(n, torch.cat([n.o, n.a], 1), next_q)
        descend(n.q_opt, qf_loss)
        if n.step % 2 == 0:
            actor_loss = -n.qf1(torch.cat([n.o, torch.tanh(actor(n.o)) * 2], 1)).mean()
            descend(a_opt, actor_loss)
            polyak(0.005, (actor_t, actor), (n.qf1_t, n.qf1), (n.qf2_t, n.qf2))
            actor_loss.item()
        qf_loss.item()

    return step


def reference_dqn(d: TensorDict, device: str) -> Step:
    q = q_net(4, 2, (120, 84)).to(device)
    target, opt, n = (
        copy.deepcopy(q),
        torch.optim.Adam(q.parameters(), lr=2.5e-4),
        SimpleNamespace(step=0),
    )

    def step() -> None:
        n.step += 1
        with torch.no_grad():
            td_target = d["reward"] + 0.99 * target(d["next_obs"]).max(1).values * (
                1 - d["terminated"].float()
            )
        loss = F.mse_loss(
            q(d["obs"]).gather(1, d["action"].long().unsqueeze(1)).squeeze(1), td_target
        )
        descend(opt, loss)
        if n.step % 50 == 0:
            polyak(1.0, (target, q))
        loss.item()

    return step


def reference_iql(d: TensorDict, device: str) -> Step:
    n = parts(d, device)
    value, actor = q_net(n.o.shape[1]).to(device), q_net(n.o.shape[1], n.a.shape[1]).to(device)
    log_std = torch.zeros(n.a.shape[1], requires_grad=True, device=device)
    v_opt, a_opt = (
        torch.optim.Adam(value.parameters(), lr=3e-4),
        torch.optim.Adam([*actor.parameters(), log_std], lr=3e-4),
    )

    def step() -> None:
        x = torch.cat([n.o, n.a], 1)
        with torch.no_grad():
            target_q = torch.min(n.qf1_t(x), n.qf2_t(x)).view(-1)
        adv = target_q - value(n.o).view(-1)
        v_loss = (torch.abs(0.7 - (adv < 0).float()) * adv.pow(2)).mean()
        descend(v_opt, v_loss)
        with torch.no_grad():
            target = n.r + (1 - n.done) * 0.99 * value(n.o2).view(-1)
        q_loss = twin_mse(n, x, target)
        descend(n.q_opt, q_loss)
        dist = torch.distributions.Normal(torch.tanh(actor(n.o)) * 2, log_std.clamp(-20, 2).exp())
        actor_loss = -(
            torch.exp(3.0 * adv.detach()).clamp(max=100.0) * dist.log_prob(n.a).sum(-1)
        ).mean()
        descend(a_opt, actor_loss)
        polyak(0.005, (n.qf1_t, n.qf1), (n.qf2_t, n.qf2))
        v_loss.item(), q_loss.item(), actor_loss.item()

    return step


def reference_cql(d: TensorDict, device: str, k: int) -> Step:
    n = parts(d, device)
    a_opt, alpha_opt = (
        torch.optim.Adam(n.actor.parameters(), lr=1e-4),
        torch.optim.Adam([n.log_alpha], lr=1e-4),
    )
    b, o_rep, o2_rep = n.o.shape[0], n.o.repeat_interleave(k, 0), n.o2.repeat_interleave(k, 0)
    uniform = torch.full((b * k, 1), math.log(1 / 4), device=device)  # Pendulum's box is 4 wide

    def step() -> None:
        actor_loss, log_pi = sac_actor_loss(n, n.log_alpha.exp().detach())
        descend(a_opt, actor_loss)
        descend(alpha_opt, -(n.log_alpha.exp() * (log_pi.detach() - 1.0)).mean())
        with torch.no_grad():
            a2, _ = n.actor.get_action(n.o2)
            x2 = torch.cat([n.o2, a2], 1)
            target = n.r + (1 - n.done) * 0.99 * torch.min(n.qf1_t(x2), n.qf2_t(x2)).view(-1)
            kinds = [
                (torch.rand(b * k, n.a.shape[1], device=device) * 4 - 2, uniform),
                n.actor.get_action(o_rep),
                n.actor.get_action(o2_rep),
            ]
        x, gaps = torch.cat([n.o, n.a], 1), []
        q_data = [n.qf1(x).view(-1), n.qf2(x).view(-1)]
        td_loss = F.mse_loss(q_data[0], target) + F.mse_loss(q_data[1], target)
        for qf, q in zip((n.qf1, n.qf2), q_data):
            soft_max = torch.logsumexp(
                torch.cat(
                    [(qf(torch.cat([o_rep, acts], 1)) - logp).view(b, k) for acts, logp in kinds], 1
                ),
                1,
            )
            gaps.append((soft_max - q).mean())
        descend(n.q_opt, td_loss + 5.0 * (gaps[0] + gaps[1]))
        polyak(0.005, (n.qf1_t, n.qf1), (n.qf2_t, n.qf2))
        td_loss.item(), actor_loss.item()

    return step
