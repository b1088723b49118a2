"""Write an offline dataset: roll out a behaviour policy on every rank (``harness dataset``).

    harness dataset env=pendulum out=datasets/pendulum-random frames=50000
    harness dataset --nproc 2 env=pendulum out=datasets/pendulum-medium \\
        policy=runs/sac/checkpoints/step-000000006000 reference.expert_policy=runs/sac
    harness dataset mix=[datasets/a,datasets/b] out=datasets/a+b   # a mixed dataset
    harness dataset recipe=pendulum_medium seed=0                  # by D4RL's recipe (recipe.py)
    harness dataset verify=datasets/pendulum-medium-seed0          # its bytes against meta.json
    torchrun --nproc_per_node=2 -m harness.cli.dataset ...         # the ranks, started by hand

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
from typing import cast

import hydra
import numpy as np
import torch
import torch.distributed as dist
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from harness.algos.base import Policy
from harness.cli import errors as cli
from harness.cli import recipe as recipes
from harness.cli.dataset_config import DatasetConfig
from harness.cli.policies import RandomPolicy, load_policy
from harness.collect.envs import env_spec, make_vec_env
from harness.collect.evaluate import eval_seed, evaluate
from harness.collect.rollout import RolloutCollector
from harness.data import dataset
from harness.distributed.setup import join, shutdown_distributed
from harness.distributed.topology import Layout
from harness.sync.contract import Header

log = logging.getLogger("harness")


def roll_out_share(
    cfg: DatasetConfig, layout: Layout, policy: Policy, values: dict[str, float]
) -> list[float]:
    """Fill this rank's share of the storage (rank 0 allocates it); returns the returns of the
    episodes that ended in it."""
    envs = make_vec_env(cfg.env.id, cfg.num_envs, cfg.env.max_episode_steps)
    torch.manual_seed(cfg.seed + layout.rank)
    world = layout.world_size
    steps = max(1, min(1000, cfg.frames // (world * cfg.num_envs)))
    collector = RolloutCollector(
        envs, policy, steps * cfg.num_envs, cfg.seed + layout.rank * cfg.num_envs, next_obs=True
    )
    if layout.rank == 0:
        dataset.allocate(cfg.out, collector.batch["rollout"][0, 0], cfg.frames)
    if world > 1:
        dist.barrier()
    storage = dataset.open_storage(cfg.out)
    shares = [cfg.frames // world + (r < cfg.frames % world) for r in range(world)]
    cursor, end = sum(shares[: layout.rank]), sum(shares[: layout.rank + 1])
    header = Header(version=0, frames=0, stop=False, values=values)
    returns: list[float] = []
    try:
        while cursor < end:
            batch = collector.collect(header)
            rows = batch["rollout"].select(*dataset.FIELDS).reshape(-1)[: end - cursor]
            storage[cursor : cursor + rows.shape[0]] = rows
            cursor += rows.shape[0]
            returns += [r for row, r in collector.ended_returns if row < rows.shape[0]]
    finally:
        envs.close()
    return returns


def mean_return(cfg: DatasetConfig, policy: Policy, values: dict[str, float]) -> float:
    """A reference return: ``reference.episodes`` deterministic episodes."""
    envs = make_vec_env(
        cfg.env.id, cfg.reference.episodes, cfg.env.max_episode_steps, training=False
    )
    try:
        return float(
            np.mean(evaluate(policy, envs, eval_seed(cfg.seed, 0, cfg.reference.episodes), values))
        )
    finally:
        envs.close()


def finish(
    cfg: DatasetConfig, policy: RandomPolicy, returns: list[float], sources: list[dict]
) -> None:
    """Rank 0: measure the reference returns, then write ``meta.json``."""
    ref = cfg.reference
    random_return = (
        ref.random_return if ref.random_return is not None else mean_return(cfg, policy, {})
    )
    expert_return = ref.expert_return
    if ref.expert_policy is not None:
        expert, expert_values, _ = load_policy(ref.expert_policy, cfg.env.id)
        expert_return = mean_return(cfg, expert, expert_values)
    meta = dataset.Meta(
        env=cfg.env.id,
        transitions=cfg.frames,
        **dataset.episode_fields(returns),
        random_return=random_return,
        expert_return=expert_return,
        sources=sources,
    )
    dataset.finish(cfg.out, meta)
    log.info(
        "wrote %s: %d transitions, %d episodes, behaviour return %.1f (random %.1f, expert %s)",
        cfg.out,
        meta.transitions,
        meta.episodes,
        meta.behaviour_return,
        random_return,
        "none" if expert_return is None else f"{expert_return:.1f}",
    )


def write(cfg: DatasetConfig, layout: Layout) -> None:
    """Every rank rolls out its share; rank 0 then describes the whole."""
    random = RandomPolicy(env_spec(cfg.env.id, cfg.env.max_episode_steps))
    policy: Policy
    values: dict[str, float]
    if cfg.policy is None:
        policy, values, source = random, {}, {"policy": "random"}
    else:
        policy, values, source = load_policy(cfg.policy, cfg.env.id)
    returns = roll_out_share(cfg, layout, policy, values)
    sources: list = [{**source, "rank": layout.rank, "seed": cfg.seed + layout.rank}]
    if not layout.single_process:
        shares: list = [None] * layout.world_size
        dist.all_gather_object(shares, (sources[0], returns))
        sources = [source for source, _ in shares]
        returns = [r for _, share in shares for r in share]
    if layout.rank == 0:
        finish(cfg, random, returns, sources)


def write_without_ranks(cfg: DatasetConfig) -> bool:
    """``verify=``, ``recipe=`` and ``mix=``: one process does it all. Returns whether ``cfg``
    asked for one of them."""
    if cfg.verify is not None:
        meta = dataset.verify(cfg.verify)
        log.info("%s holds the data its meta.json describes: sha256 %s", cfg.verify, meta.digest)
    elif cfg.recipe is not None:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ValueError(
                "a recipe writes from one process (its digest depends on it): leave --nproc out"
            )
        meta = recipes.write(cfg)
        log.info(
            "wrote %s by recipe %s, seed %d: %d transitions, behaviour return %.1f (random %.1f, "
            "expert %s), sha256 %s",
            cfg.out,
            cfg.recipe.name,
            cfg.seed,
            meta.transitions,
            meta.behaviour_return,
            meta.random_return,
            "none" if meta.expert_return is None else f"{meta.expert_return:.1f}",
            meta.digest,
        )
    elif cfg.mix:
        meta = dataset.concatenate(cfg.mix, cfg.out)
        log.info("wrote %s: %d transitions from %s", cfg.out, meta.transitions, ", ".join(cfg.mix))
    return cfg.verify is not None or cfg.recipe is not None or bool(cfg.mix)


ConfigStore.instance().store(name="write_dataset_schema", node=DatasetConfig)


@hydra.main(version_base=None, config_path="../../conf", config_name="write_dataset")
def main(raw: DictConfig) -> None:
    with cli.user_errors():  # a mistake in the command: said once, by rank 0, without a traceback
        cfg = cast(DatasetConfig, OmegaConf.to_object(raw))  # composed on write_dataset_schema
        if write_without_ranks(cfg):
            return
        dataset.refuse_existing(cfg.out)  # on every rank: none waits for a rank 0 that refused
        layout = Layout.from_env(trainers=1)
    try:
        if not layout.single_process:
            join(layout, cfg.dist_timeout_s, role="dataset writer")
        write(cfg, layout)
    finally:
        shutdown_distributed()


HELP = """\
Write an offline dataset: every rank rolls out the behaviour policy (or random actions) into one
dataset.

  harness dataset env=pendulum out=datasets/pendulum-random frames=50000
  harness dataset --nproc 2 env=hopper out=DIR policy=RUN_DIR_OR_CHECKPOINT
  harness dataset mix=[datasets/a,datasets/b] out=datasets/a+b
  harness dataset recipe=hopper_medium seed=0        (conf/recipe/: train, stop, roll out)
  harness dataset verify=DIR                         (its bytes against meta.json's digest)"""

if __name__ == "__main__":
    cli.run(main, "write_dataset", HELP)
