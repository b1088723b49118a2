"""Write an offline dataset: roll out a behaviour policy on every rank.

    python -m harness.dataset env=pendulum out=datasets/pendulum-random frames=50000
    torchrun --nproc_per_node=2 -m harness.dataset env=pendulum out=datasets/pendulum-medium \\
        policy=runs/sac/checkpoints/step-000000006000 reference.expert_policy=runs/sac
    python -m harness.dataset mix=[datasets/a,datasets/b] out=datasets/a+b   # a mixed dataset

``policy`` is a checkpoint (``<run_dir>/checkpoints/step-*``) or a run
directory (its newest checkpoint); without it actions are uniformly random.
The policy acts as it did in training (stochastic, with the exploration its
algorithm had at that checkpoint). Every rank collects its share of
``frames`` into one memory-mapped storage made by rank 0 (a shared file
system across nodes); rank 0 then measures the reference returns and writes
``meta.json``. See :mod:`harness.data.dataset` for the format.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Mapping, Optional

import hydra
import numpy as np
import torch
import torch.distributed as dist
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from tensordict import TensorDict

from harness import checkpoint
from harness.algos import ALGOS
from harness.algos.base import Policy
from harness.collect.envs import EnvSpec, env_spec, make_vec_env, spec_of
from harness.collect.evaluate import evaluate
from harness.collect.rollout import RolloutCollector
from harness.config import EnvConfig
from harness.data import dataset
from harness.sync.contract import Header

log = logging.getLogger("harness")


@dataclass
class ReferenceConfig:
    """The returns that normalised scores are measured against."""

    episodes: int = 10  # deterministic episodes per measured reference
    random_return: Optional[float] = None  # known random return; default: measured with uniform random actions
    expert_return: Optional[float] = None  # known expert return, or:
    expert_policy: Optional[str] = None  # a checkpoint or run directory whose policy's return is measured


@dataclass
class DatasetConfig:
    env: EnvConfig = field(default_factory=EnvConfig)
    out: str = MISSING  # the dataset directory to write
    policy: Optional[str] = None  # behaviour policy: checkpoint or run directory; None: uniform random actions
    frames: int = 100_000  # transitions, all ranks together
    num_envs: int = 4  # envs per rank
    mix: list[str] = field(default_factory=list)  # instead of collecting: concatenate these datasets into out
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    seed: int = 1
    dist_timeout_s: float = 300.0  # bounds every collective (the slowest rank's collection included)

    def __post_init__(self) -> None:
        if self.frames < 1 or self.num_envs < 1 or self.reference.episodes < 1:
            raise ValueError("frames, num_envs and reference.episodes must be >= 1")
        if self.reference.expert_return is not None and self.reference.expert_policy is not None:
            raise ValueError("give reference.expert_return or reference.expert_policy, not both")


class RandomPolicy(Policy):
    """Uniform random actions (the random reference, and random datasets)."""

    def __init__(self, spec: EnvSpec):
        super().__init__()
        self.spec = spec

    def forward(self, obs: torch.Tensor, values: Mapping[str, float] = {}, deterministic: bool = False) -> TensorDict:
        n, spec = obs.shape[0], self.spec
        if spec.discrete:
            action = torch.randint(0, spec.num_actions, (n,))
        else:
            low, high = torch.tensor(spec.action_low), torch.tensor(spec.action_high)
            action = (low + (high - low) * torch.rand(n, spec.num_actions)).reshape(n, *spec.action_shape)
        return TensorDict(action=action, batch_size=[n])


def load_policy(path: str, env_id: str) -> tuple[Policy, dict[str, float], dict]:
    """The policy a checkpoint holds, the header values it acted with at that
    point of training, and a description for ``meta.json``."""
    where = Path(path)
    run_dir = where.parent.parent if (where / "state.pt").exists() else where
    if not (run_dir / "config.yaml").exists():
        raise FileNotFoundError(f"policy={path}: no run directory with a config.yaml there; give a run directory or one of its checkpoints/step-*")
    run_cfg = OmegaConf.load(run_dir / "config.yaml")
    name = run_cfg.algo.name
    algo_cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ALGOS[name].Config), run_cfg.algo))
    if (where / "state.pt").exists():
        state, meta = checkpoint.read(where)
    else:
        found = checkpoint.load_latest(run_dir, name, run_cfg.env.id)
        if found is None:
            raise FileNotFoundError(f"policy={path}: the run directory has no readable checkpoint")
        state, meta, where = found
    if meta["env"] != env_id:
        raise ValueError(f"policy={path} was trained on {meta['env']}, but env.id={env_id}: pick env= to match")
    algo = ALGOS[name](algo_cfg, env_spec(env_id), run_cfg.collector.total_frames)
    algo.load_state_dict(state["algo"])
    policy = algo.published_models()["policy"]
    policy.eval()
    return policy, algo.values_for_header(meta["frames"]), {"policy": str(where), "algo": name, "frames": meta["frames"]}


def mean_return(policy: Policy, values: dict[str, float], cfg: DatasetConfig) -> float:
    envs = make_vec_env(cfg.env.id, cfg.reference.episodes, cfg.env.max_episode_steps)
    try:
        return float(np.mean(evaluate(policy, envs, cfg.seed + 20_000_000, values)))
    finally:
        envs.close()


def collect(cfg: DatasetConfig, rank: int, world: int) -> None:
    envs = make_vec_env(cfg.env.id, cfg.num_envs, cfg.env.max_episode_steps)
    spec = spec_of(envs)
    if cfg.policy is None:
        policy, values, source = RandomPolicy(spec), {}, {"policy": "random"}
    else:
        policy, values, source = load_policy(cfg.policy, cfg.env.id)
    torch.manual_seed(cfg.seed + rank)
    steps = max(1, min(1000, cfg.frames // (world * cfg.num_envs)))
    collector = RolloutCollector(envs, policy, steps * cfg.num_envs, cfg.seed + rank * cfg.num_envs, next_obs=True)
    shares = [cfg.frames // world + (r < cfg.frames % world) for r in range(world)]
    if rank == 0:
        dataset.allocate(cfg.out, collector.batch["rollout"][0, 0], cfg.frames)
    if world > 1:
        dist.barrier()
    storage = dataset.open_storage(cfg.out)
    cursor, end = sum(shares[:rank]), sum(shares[: rank + 1])
    header = Header(version=0, frames=0, stop=False, values=values)
    totals = torch.zeros(2, dtype=torch.float64)  # episodes, their return sum
    while cursor < end:
        batch = collector.collect(header)
        rows = batch["rollout"].select(*dataset.FIELDS).reshape(-1)[: end - cursor]
        storage[cursor : cursor + rows.shape[0]] = rows
        cursor += rows.shape[0]
        totals += torch.stack([batch["stats", "episodes"], batch["stats", "return_sum"]])
    envs.close()
    if world > 1:
        dist.all_reduce(totals)
        sources = [None] * world
        dist.all_gather_object(sources, {**source, "rank": rank, "seed": cfg.seed + rank})
    else:
        sources = [{**source, "rank": 0, "seed": cfg.seed}]
    if rank != 0:
        return
    episodes, return_sum = totals.tolist()
    ref = cfg.reference
    random_return = ref.random_return if ref.random_return is not None else mean_return(RandomPolicy(spec), {}, cfg)
    expert_return = ref.expert_return
    if ref.expert_policy is not None:
        expert, expert_values, _ = load_policy(ref.expert_policy, cfg.env.id)
        expert_return = mean_return(expert, expert_values, cfg)
    meta = dataset.Meta(
        env=cfg.env.id, transitions=cfg.frames, episodes=int(episodes),
        behaviour_return=return_sum / episodes if episodes else float("nan"),
        random_return=random_return, expert_return=expert_return, sources=sources,
    )
    dataset.finish(cfg.out, meta)
    log.info("wrote %s: %d transitions, %d episodes, behaviour return %.1f (random %.1f, expert %s)",
             cfg.out, meta.transitions, meta.episodes, meta.behaviour_return, random_return, expert_return)


ConfigStore.instance().store(name="dataset_schema", node=DatasetConfig)


@hydra.main(version_base=None, config_path="../conf", config_name="dataset")
def main(raw: DictConfig) -> None:
    cfg: DatasetConfig = OmegaConf.to_object(raw)
    if cfg.mix:
        meta = dataset.concatenate(cfg.mix, cfg.out)
        log.info("wrote %s: %d transitions from %s", cfg.out, meta.transitions, ", ".join(cfg.mix))
        return
    dataset.refuse_existing(cfg.out)  # on every rank: none waits for a rank 0 that refused
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    if world > 1:
        dist.init_process_group("gloo", timeout=timedelta(seconds=cfg.dist_timeout_s))
    try:
        collect(cfg, rank, world)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
