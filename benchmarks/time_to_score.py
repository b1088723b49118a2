"""Seconds from launch to a score: the default job (``torchrun --nproc_per_node=3
-m harness.train``: PPO on CartPole-v1, 1 trainer + 2 collectors) against a
single-file PPO launched the same way a user launches CleanRL's ``ppo.py``
(one process, its settings: 4 envs x 128 steps, 4 epochs of 4 minibatches,
lr 2.5e-4 annealed, entropy bonus 0.01), written out below as the reference.

Both report the mean return of the episodes that ended in each window of
``--log-every`` frames (the harness's ``train/episode_return`` row); the time to
the score is when the first window at or above ``--score`` is seen, counted from
the launch, so start-up is included. ``--against DIR`` adds the default job of
another checkout (an earlier commit in a git worktree) as a third contestant.
``--variant NAME OVERRIDE...`` adds the default job with those Hydra overrides
as another contestant (``--variant async collector.mode=async``: async PPO
with V-trace), and ``--no-reference`` leaves the single-file PPO out.
Seeds run interleaved (this build, the other, the reference, this build, ...)
so that a noisy machine hits all alike; medians are reported. Every process
runs with ``OMP_NUM_THREADS=1``, as ``scripts/train.sh`` launches the harness.

    python benchmarks/time_to_score.py --json /tmp/time_to_score.json
    git worktree add /tmp/before <commit>
    python benchmarks/time_to_score.py --against /tmp/before
    python benchmarks/time_to_score.py --variant async collector.mode=async --no-reference
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


# CleanRL ppo.py's settings for CartPole-v1: envs, steps per segment, epochs, minibatches, lr, ...
NUM_ENVS, STEPS, EPOCHS, MINIBATCHES, LR = 4, 128, 4, 4, 2.5e-4
GAMMA, LAM, CLIP, ENT_COEF, VF_COEF, MAX_NORM = 0.99, 0.95, 0.2, 0.01, 0.5, 0.5


def reference_ppo(seed: int, frames: int, log_every: int) -> None:
    """CleanRL ppo.py's algorithm and settings, one process; prints ``frames mean_return`` per
    window."""
    import gymnasium as gym
    import numpy as np
    import torch
    from torch.distributions import Categorical

    torch.manual_seed(seed)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(NUM_ENVS)])
    )
    critic, actor = reference_networks()
    params = [*critic.parameters(), *actor.parameters()]
    opt = torch.optim.Adam(params, lr=LR, eps=1e-5)
    obs_buf = torch.zeros(STEPS, NUM_ENVS, 4)
    act_buf, logp_buf, rew_buf, done_buf, val_buf = (torch.zeros(STEPS, NUM_ENVS) for _ in range(5))
    obs, _ = envs.reset(seed=seed)
    obs, done = torch.as_tensor(obs, dtype=torch.float32), torch.zeros(NUM_ENVS)
    windows = WindowReturns(log_every)
    updates = frames // (NUM_ENVS * STEPS)
    for update in range(updates):
        opt.param_groups[0]["lr"] = LR * (1 - update / updates)
        for t in range(STEPS):
            obs_buf[t], done_buf[t] = obs, done
            with torch.no_grad():
                dist = Categorical(logits=actor(obs))
                action = dist.sample()
                logp_buf[t], val_buf[t], act_buf[t] = (
                    dist.log_prob(action),
                    critic(obs).squeeze(-1),
                    action,
                )
            nxt, reward, term, trunc, info = envs.step(action.numpy())
            rew_buf[t] = torch.as_tensor(reward, dtype=torch.float32)
            obs = torch.as_tensor(nxt, dtype=torch.float32)
            done = torch.as_tensor(np.logical_or(term, trunc), dtype=torch.float32)
            windows.step(info)
        adv, ret = reference_gae(critic, obs, done, rew_buf, done_buf, val_buf)
        batch = [x.flatten(0, 1) for x in (obs_buf, act_buf, logp_buf, adv, ret, val_buf)]
        reference_epochs(actor, critic, opt, params, batch)


def reference_networks() -> tuple[Any, Any]:
    """CleanRL's critic and actor for CartPole: 64-64 tanh MLPs, orthogonal initialisation."""
    from torch import nn

    def layer(i: int, o: int, std: float = 2**0.5) -> nn.Linear:
        lin = nn.Linear(i, o)
        nn.init.orthogonal_(lin.weight, std)
        nn.init.zeros_(lin.bias)
        return lin

    critic = nn.Sequential(layer(4, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0))
    actor = nn.Sequential(layer(4, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 2, 0.01))
    return critic, actor


class WindowReturns:
    """Prints ``frames mean_return`` of the episodes that ended in each ``log_every`` frames."""

    def __init__(self, log_every: int):
        self.log_every, self.seen, self.window = log_every, 0, log_every
        self.returns: list[float] = []

    def step(self, info: dict) -> None:
        """After one step of every env; ``info`` is the vector env's."""
        if "episode" in info:
            self.returns += [
                float(r) for r, ended in zip(info["episode"]["r"], info["_episode"]) if ended
            ]
        self.seen += NUM_ENVS
        if self.seen >= self.window:
            mean = statistics.mean(self.returns) if self.returns else float("nan")
            print(self.seen, mean, flush=True)
            self.window, self.returns = self.window + self.log_every, []


def reference_gae(critic, obs, done, rew_buf, done_buf, val_buf) -> tuple[Any, Any]:
    """Advantages and returns of a segment, bootstrapping from the value of the state after it."""
    import torch

    with torch.no_grad():
        adv, last, next_value = (
            torch.zeros(STEPS, NUM_ENVS),
            torch.zeros(NUM_ENVS),
            critic(obs).squeeze(-1),
        )
        for t in reversed(range(STEPS)):
            not_done = 1.0 - (done if t == STEPS - 1 else done_buf[t + 1])
            nv = next_value if t == STEPS - 1 else val_buf[t + 1]
            delta = rew_buf[t] + GAMMA * nv * not_done - val_buf[t]
            adv[t] = last = delta + GAMMA * LAM * not_done * last
        ret = adv + val_buf
    return adv, ret


def reference_epochs(actor, critic, opt, params, batch) -> None:
    """The clipped-surrogate epochs over a segment's flat ``batch`` (obs, action, logp, advantage,
    return, value)."""
    import torch
    from torch import nn
    from torch.distributions import Categorical

    b_obs, b_act, b_logp, b_adv, b_ret, b_val = batch
    size = len(b_obs) // MINIBATCHES
    for _ in range(EPOCHS):
        for idx in torch.randperm(len(b_obs)).split(size):
            dist = Categorical(logits=actor(b_obs[idx]))
            ratio = (dist.log_prob(b_act[idx]) - b_logp[idx]).exp()
            a = b_adv[idx]
            a = (a - a.mean()) / (a.std() + 1e-8)
            pg = torch.max(-a * ratio, -a * ratio.clamp(1 - CLIP, 1 + CLIP)).mean()
            v = critic(b_obs[idx]).squeeze(-1)
            v_clipped = b_val[idx] + (v - b_val[idx]).clamp(-CLIP, CLIP)
            v_loss = 0.5 * torch.max((v - b_ret[idx]) ** 2, (v_clipped - b_ret[idx]) ** 2).mean()
            loss = pg - ENT_COEF * dist.entropy().mean() + VF_COEF * v_loss
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(params, MAX_NORM)
            opt.step()


def watch(
    cmd: Callable[[str], list[str]],
    returns: Callable[[str], list[float]],
    score: float,
    code: Path = ROOT,
    timeout: float = 1800,
) -> tuple[float | None, float]:
    """Launch ``cmd`` (importing ``harness`` from ``code``) in a temporary directory, output to
    ``out.txt`` there, and poll ``returns(directory)``, the window returns so far, until it ends.
    Returns (seconds from launch to the first window >= score, or None; seconds to the end)."""
    with tempfile.TemporaryDirectory() as tmp:
        return _watch(cmd(tmp), tmp, returns, score, code, timeout)


def _watch(
    cmd: list[str],
    tmp: str,
    returns: Callable[[str], list[float]],
    score: float,
    code: Path,
    timeout: float,
) -> tuple[float | None, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(code)}
    start, reached = time.perf_counter(), None
    with open(f"{tmp}/out.txt", "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT, text=True
        )
    while proc.poll() is None:
        if reached is None and any(r >= score for r in returns(tmp)):
            reached = time.perf_counter() - start
        if time.perf_counter() - start > timeout:
            proc.kill()
            raise RuntimeError(f"{cmd} ran past {timeout} s")
        time.sleep(0.05)  # polling period: the resolution of the measured time
    end = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"{cmd} failed:\n{Path(tmp, 'out.txt').read_text()[-3000:]}")
    if reached is None and any(r >= score for r in returns(tmp)):
        reached = end
    return reached, end


def harness_returns(tmp: str) -> list[float]:
    """``train/episode_return`` of each row of the run's metrics.csv."""
    try:
        with open(f"{tmp}/run/metrics.csv", newline="") as f:
            return [
                float(r["train/episode_return"])
                for r in csv.DictReader(f)
                if r.get("train/episode_return") not in (None, "", "nan")
            ]
    except FileNotFoundError:
        return []


def reference_returns(tmp: str) -> list[float]:
    """The reference's printed ``frames mean_return`` lines."""
    pairs = [line.split() for line in Path(tmp, "out.txt").read_text().splitlines()]
    return [float(p[1]) for p in pairs if len(p) == 2 and p[0].isdigit() and p[1] != "nan"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--frames", type=int, default=500_000)
    parser.add_argument("--score", type=float, default=475.0)
    parser.add_argument("--log-every", type=int, default=10_000)
    parser.add_argument("--nproc", type=int, default=3, help="ranks of the harness's job")
    parser.add_argument(
        "--against", metavar="DIR", help="also the default job of this checkout (a git worktree)"
    )
    parser.add_argument(
        "--variant",
        nargs="+",
        action="append",
        default=[],
        metavar="NAME OVERRIDE",
        help="the default job with overrides",
    )
    parser.add_argument("--no-reference", action="store_true", help="leave out the single-file PPO")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--reference-run", type=int, metavar="SEED", help=argparse.SUPPRESS)
    return parser.parse_args()


def harness_command(
    tmp: str, seed: int, args: argparse.Namespace, overrides: tuple[str, ...] = ()
) -> list[str]:
    """The default job (with ``overrides``), as ``scripts/train.sh`` launches it."""
    return [
        str(Path(sys.executable).parent / "torchrun"),
        "--standalone",
        f"--nproc_per_node={args.nproc}",
        "-m",
        "harness.train",
        f"seed={seed}",
        f"collector.total_frames={args.frames}",
        f"run_dir={tmp}/run",
        f"logger.log_every_frames={args.log_every}",
        "logger.console=false",
        "checkpoint.every_frames=0",
        *overrides,
    ]


def reference_command(tmp: str, seed: int, args: argparse.Namespace) -> list[str]:
    """This script's single-file PPO, in a process of its own."""
    return [
        sys.executable,
        __file__,
        "--reference-run",
        str(seed),
        f"--frames={args.frames}",
        f"--log-every={args.log_every}",
    ]


# A contestant: its command (of the run directory and the seed), its window returns, its checkout.
Contestant = tuple[Callable[..., list[str]], Callable[[str], list[float]], Path]


def contestants_of(args: argparse.Namespace) -> dict[str, Contestant]:
    """Every contestant ``args`` asks for, in the order each seed runs them."""
    harness = partial(harness_command, args=args)
    reference = partial(reference_command, args=args)
    contestants: dict[str, Contestant] = {
        "harness": (harness, harness_returns, ROOT),
        "reference": (reference, reference_returns, ROOT),
    }
    if args.against:
        contestants = {
            "harness": contestants["harness"],
            "against": (harness, harness_returns, Path(args.against).resolve()),
            "reference": contestants["reference"],
        }
    for name, *overrides in args.variant:
        contestants[name] = (partial(harness, overrides=tuple(overrides)), harness_returns, ROOT)
    if args.no_reference:
        del contestants["reference"]
    return contestants


def report(runs: dict[str, list[tuple[float | None, float]]], args: argparse.Namespace) -> None:
    """Medians over seeds of each contestant's time to the score and to the end, printed (and
    written to ``--json``)."""
    rows: list[dict[str, Any]] = []
    for case, results in runs.items():
        to_score = [r for r, _ in results if r is not None]
        rows.append(
            {
                "case": f"{case}/time_to_score",
                "s": statistics.median(to_score) if to_score else None,
                "reached": f"{len(to_score)}/{len(results)}",
            }
        )
        rows.append({"case": f"{case}/time_to_end", "s": statistics.median(e for _, e in results)})
    for row in rows:
        print(
            f"{row['case']:>24}: {row['s'] if row['s'] is None else round(row['s'], 1)} s "
            f"(median){'  reached ' + row['reached'] if 'reached' in row else ''}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def main() -> None:
    args = parse_args()
    if args.reference_run is not None:
        return reference_ppo(args.reference_run, args.frames, args.log_every)
    contestants = contestants_of(args)
    runs: dict[str, list[tuple[float | None, float]]] = {name: [] for name in contestants}
    for seed in args.seeds:
        for name, (cmd, returns, code) in contestants.items():
            runs[name].append(watch(partial(cmd, seed=seed), returns, args.score, code))
        print(
            f"seed {seed}: "
            + "   ".join(
                f"{k} {v[-1][0] or float('nan'):.1f} s to {args.score:g}, {v[-1][1]:.1f} s in all"
                for k, v in runs.items()
            ),
            flush=True,
        )
    report(runs, args)


if __name__ == "__main__":
    main()
