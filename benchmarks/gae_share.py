"""The share of a PPO update spent computing advantages, and the scan against a loop over time.

    python benchmarks/gae_share.py [--repeats 7] [--device cpu] [--json gae-share.json]

``update``: one round of ``experiment=ppo_halfcheetah`` (1 env x 2,048 steps, 10 epochs of 32
minibatches), ``algo.update`` on a round of random HalfCheetah-shaped frames with episode ends;
``in_gae``: the part of it inside ``gae`` (timed by wrapping the function the update calls);
``share``: their ratio, per round, median. Then GAE alone at 1x512, 32x512 and 1x2048, the
harness's scan against ``loop``, the Python loop over time that GAE was before (a reference
written here), interleaved (each timed call after an untimed one of the same function), medians,
one thread. Python's garbage collector is off while
timing: the loop's thousands of small tensors would otherwise set off collections that land in
whichever call runs next.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from tensordict import TensorDict

import harness.algos.ppo as ppo_module
from harness.algos.gae import gae
from harness.algos.ppo import PPO
from harness.config import load, register_configs

ROOT = Path(__file__).resolve().parents[1]
STEPS, OBS, ACT = 2048, 17, 6  # ppo_halfcheetah's round, HalfCheetah-v5's sizes


def loop_gae(reward, value, done, next_value, gamma, lam):
    """GAE as one step per loop iteration, backwards in time (the textbook recursion)."""
    advantages, last = torch.zeros_like(reward), torch.zeros_like(next_value)
    for t in reversed(range(reward.shape[0])):
        following = next_value if t == reward.shape[0] - 1 else value[t + 1]
        nonterminal = 1.0 - done[t].float()
        last = (
            reward[t]
            + gamma * following * nonterminal
            - value[t]
            + gamma * lam * nonterminal * last
        )
        advantages[t] = last
    return advantages


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def halfcheetah_round(device: str) -> tuple[PPO, TensorDict]:
    register_configs()
    with initialize_config_dir(version_base=None, config_dir=str(ROOT / "conf")):
        cfg = load(compose("config", overrides=["experiment=ppo_halfcheetah"]))
    spec = cfg.env.spec()
    algo = PPO(cfg.algo, spec, cfg.collector.total_frames, device=device)
    done = torch.rand(STEPS, 1) < 1 / 1000  # HalfCheetah's episodes: 1,000 steps
    rollout = TensorDict(
        obs=torch.randn(STEPS, 1, OBS),
        action=torch.rand(STEPS, 1, ACT) * 2 - 1,
        logprob=torch.randn(STEPS, 1),
        reward=torch.randn(STEPS, 1),
        done=done,
        terminated=torch.zeros(STEPS, 1, dtype=torch.bool),
        batch_size=[STEPS, 1],
    )
    return algo, TensorDict(rollout=rollout, next_obs=torch.randn(1, OBS))


def update_share(repeats: int, device: str) -> dict[str, float]:
    algo, batch = halfcheetah_round(device)
    in_gae: list[float] = []

    def timed_gae(*args, **kwargs):
        sync(device)
        start = time.perf_counter()
        out = gae(*args, **kwargs)
        sync(device)
        in_gae.append(time.perf_counter() - start)
        return out

    ppo_module.gae = timed_gae  # the name PPO.targets calls
    rounds, shares = [], []
    for round_ in range(repeats + 1):
        sync(device)
        start = time.perf_counter()
        algo.update([batch], frames=0)
        sync(device)
        if round_:  # the first round warms up
            rounds.append(time.perf_counter() - start)
            shares.append(in_gae[-1] / rounds[-1])
    ppo_module.gae = gae
    return {
        "update_s": statistics.median(rounds),
        "in_gae_s": statistics.median(in_gae[1:]),
        "share": statistics.median(shares),
    }


def scan_against_loop(repeats: int, device: str) -> list[dict[str, float | str]]:
    rows: list[dict[str, float | str]] = []
    for steps, envs in [(512, 1), (512, 32), (2048, 1)]:
        args = (
            torch.randn(steps, envs, device=device),
            torch.randn(steps, envs, device=device),
            torch.rand(steps, envs, device=device) < 0.01,
            torch.randn(envs, device=device),
            0.99,
            0.95,
        )
        fns: dict[str, Callable] = {"scan": gae, "loop": loop_gae}
        samples: dict[str, list[float]] = {name: [] for name in fns}
        for round_ in range(repeats + 1):
            for name, fn in fns.items():
                fn(*args)  # untimed: the other function's leftovers (caches, freed memory) go first
                sync(device)
                start = time.perf_counter()
                fn(*args)
                sync(device)
                if round_:
                    samples[name].append(time.perf_counter() - start)
        scan_s, loop_s = (statistics.median(samples[n]) for n in ("scan", "loop"))
        rows.append(
            {
                "shape": f"{envs}x{steps}",
                "scan_s": scan_s,
                "loop_s": loop_s,
                "speedup": loop_s / scan_s,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds (after a warm-up)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gc.disable()
    share = update_share(args.repeats, args.device)
    print(
        f"ppo_halfcheetah update: {share['update_s']:.3f} s a round, {share['in_gae_s'] * 1e3:.2f} "
        f"ms in GAE: {share['share']:.2%} (medians of {args.repeats}, {args.device}, 1 thread)"
    )
    rows = scan_against_loop(args.repeats * 4, args.device)
    for row in rows:
        print(
            f"GAE {row['shape']:>7}: scan {float(row['scan_s']) * 1e3:7.3f} ms, "
            f"loop {float(row['loop_s']) * 1e3:7.3f} ms, {float(row['speedup']):.1f}x"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"update": share, "gae": rows}, indent=1))


if __name__ == "__main__":
    main()
