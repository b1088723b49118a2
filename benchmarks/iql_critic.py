"""What an IQL run's critic says about its dataset, checkpoint by checkpoint.

    python benchmarks/iql_critic.py runs/offline/iql_hopper_medium-data0-seed1 \\
        datasets/hopper-medium-seed0 [--columns 4] [--samples 20000]

For a sample of the dataset's transitions: V(s) against the discounted return-to-go of the data
(Monte Carlo along each env's own rows, the rewards scaled as the run scaled them); the advantage
Q(s, a) - V(s) that weights the actor's regression, against the immediate reward and against
return-to-go - V(s) (a one-sample estimate of the data's own advantage); and the weights
``exp(beta * A)`` (clipped at 100): their mean, largest, and effective share
``(sum w)^2 / (n sum w^2)``, the fraction of the sample the regression effectively learns from.
``--columns``: the envs the dataset was written with (its rows interleave their steps; a recipe's
``num_envs``, 4 unless set; 1 for medium-replay).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from harness.algos.iql import IQL, IQLConfig
from harness.collect.envs import env_spec, episode_cutoff
from harness.core import checkpoint
from harness.data import dataset


def returns_to_go(reward: np.ndarray, end: np.ndarray, columns: int, gamma: float) -> np.ndarray:
    """Each row's discounted return to its episode's end, along its env's rows."""
    togo = np.zeros(len(reward))
    for column in range(columns):
        g = 0.0
        for i in range(len(reward) - columns + column, -1, -columns):
            g = reward[i] + (0.0 if end[i] else gamma * g)
            togo[i] = g
    return togo


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("dataset")
    p.add_argument("--columns", type=int, default=4)
    p.add_argument("--samples", type=int, default=20_000)
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = OmegaConf.load(args.run_dir / "config.yaml")
    data, meta = dataset.load(args.dataset, cfg.env.id)
    scale = float(cfg.algo.reward_scale)
    if cfg.algo.get("normalize_reward"):
        scale *= meta.reward_normalizer(episode_cutoff(cfg.env.id, cfg.env.max_episode_steps) or 0)
    n = data.shape[0]
    reward = data["reward"].double().numpy() * scale
    end = (data["terminated"] | data["truncated"]).numpy()
    togo = returns_to_go(reward, end, args.columns, float(cfg.algo.gamma))
    spec = env_spec(cfg.env.id, cfg.env.max_episode_steps)
    fields = {k: cfg.algo[k] for k in ("deterministic_actor", "normalize_obs", "hidden")}
    pick = torch.from_numpy(np.random.default_rng(0).choice(n, min(args.samples, n), replace=False))
    print(f"rewards times {scale:.4g}; {len(pick)} transitions of {n:,}")
    for path in sorted(checkpoint.checkpoint_dir(args.run_dir).glob("step-*")):
        state, _ = checkpoint.read(path)
        algo = IQL(IQLConfig(compile=False, **fields), spec, 10**6)
        algo.load_state_dict(state["algo"])
        batch = algo.normalized_batch(data[pick].to_tensordict())
        with torch.no_grad():
            v = algo.value(batch["obs"]).squeeze(-1).double().numpy()
            q = algo.critics.targets(batch["obs"], batch["action"]).min(0).values.double().numpy()
        a, g, r = q - v, togo[pick.numpy()], reward[pick.numpy()]
        w = np.minimum(np.exp(float(cfg.algo.beta) * a), 100.0)
        share = w.sum() ** 2 / (w * w).sum() / len(w)
        print(
            f"{path.name}: V {v.mean():.1f} against return-to-go {g.mean():.1f} (correlation "
            f"{np.corrcoef(v, g)[0, 1]:.2f}); A against r {np.corrcoef(a, r)[0, 1]:.2f}, against "
            f"return-to-go - V {np.corrcoef(a, g - v)[0, 1]:.2f}; weights mean {w.mean():.2f}, "
            f"largest {w.max():.1f}, effective share {share:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
