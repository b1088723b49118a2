"""A collector rank: act with the newest weights, send batches to a trainer."""

from __future__ import annotations

import torch

from harness.algos import ALGOS
from harness.collect.envs import make_vec_env, spec_of
from harness.collect.rollout import RolloutCollector
from harness.config import Config
from harness.data.channel import BatchSender
from harness.distributed.setup import Groups
from harness.distributed.topology import Layout
from harness.sync import WeightSubscriber, make_subscriber


def build_collector(cfg: Config, rank: int, subscriber: WeightSubscriber) -> RolloutCollector:
    """Envs and a policy whose weights are bound to ``subscriber``'s buffer.

    Rank ``r``'s envs take seeds ``seed + r * num_envs`` onwards, so no two
    envs of a job share a seed and the same seed reproduces the same run.
    """
    torch.manual_seed(cfg.seed + rank)
    envs = make_vec_env(cfg.env.id, cfg.collector.num_envs, cfg.env.max_episode_steps)
    algo = ALGOS[cfg.algo.name]
    policy = algo.make_policy(cfg.algo, spec_of(envs))
    subscriber.connect({"policy": policy}, algo.header_values)
    return RolloutCollector(envs, policy, cfg.collector.frames_per_batch, seed=cfg.seed + rank * cfg.collector.num_envs)


def run_collector(cfg: Config, layout: Layout, groups: Groups) -> None:
    subscriber = make_subscriber(cfg.sync, layout.rank, groups)
    collector = build_collector(cfg, layout.rank, subscriber)
    sender = BatchSender(groups.data, layout.rank, layout.trainer_of(layout.rank), collector.batch, cfg.dist_timeout_s)
    try:
        header = subscriber.wait(min_version=0)
        while not header.stop:
            sender.send(collector.collect(header))  # round r is collected with version r
            header = subscriber.wait(min_version=header.version + 1)
    finally:
        subscriber.close()
        collector.envs.close()
