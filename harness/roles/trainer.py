"""A trainer rank: learn from collectors' batches, publish weights, log."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tensordict import TensorDict

from harness.algos import ALGOS, Algorithm
from harness.collect.envs import env_spec
from harness.collect.rollout import RolloutCollector, batch_template
from harness.config import Config
from harness.data.channel import BatchReceiver
from harness.distributed.setup import Groups
from harness.distributed.topology import Layout
from harness.metrics.logger import MetricsLogger
from harness.roles.collector import build_collector
from harness.sync import Header, WeightPublisher, WeightSubscriber, make_publisher
from harness.sync.local import local_pair


class InlineCollector:
    """World size 1: the trainer's own rank collects each round itself."""

    def __init__(self, collector: RolloutCollector, subscriber: WeightSubscriber):
        self.collector, self.subscriber = collector, subscriber

    def receive(self) -> list[TensorDict]:
        self.subscriber.poll()
        return [self.collector.collect(self.subscriber.header)]


class RoundStats:
    """What the collectors' batches say, summed between two log rows."""

    def __init__(self):
        self.episodes = self.return_sum = self.length_sum = 0.0
        self.lags: list[torch.Tensor] = []

    def add(self, batches: list[TensorDict], version: int) -> None:
        for b in batches:
            self.episodes += float(b["stats", "episodes"])
            self.return_sum += float(b["stats", "return_sum"])
            self.length_sum += float(b["stats", "length_sum"])
            self.lags.append(version - b["rollout", "policy_version"].flatten())

    def pop(self) -> dict[str, float]:
        lag = torch.cat(self.lags).float()
        n = self.episodes
        row = {
            "train/episode_return": self.return_sum / n if n else float("nan"),
            "train/episode_length": self.length_sum / n if n else float("nan"),
            "train/episodes": n,
            "collect/policy_lag_min": lag.min().item(),
            "collect/policy_lag_mean": lag.mean().item(),
            "collect/policy_lag_max": lag.max().item(),
        }
        self.__init__()
        return row


def run_trainer(cfg: Config, layout: Layout, groups: Groups | None, run_dir: Path) -> dict[str, float]:
    """Train until ``collector.total_frames``; returns the last metrics row."""
    torch.manual_seed(cfg.seed)
    spec = env_spec(cfg.env.id, cfg.env.max_episode_steps)
    algo: Algorithm = ALGOS[cfg.algo.name](cfg.algo, spec, cfg.collector.total_frames)
    publisher, source = connect(cfg, layout, groups, algo)
    logger = MetricsLogger(run_dir, cfg.collector.total_frames, console=cfg.logger.console)

    frames, version, last_row = 0, 0, {}
    publisher.publish(Header(version, frames, values=algo.values_for_header(frames)))
    stats, next_log, since = RoundStats(), cfg.logger.log_every_frames, (time.monotonic(), 0)
    try:
        while frames < cfg.collector.total_frames:
            batches = source.receive()  # every frame acted with weights `version`
            stats.add(batches, version)
            metrics = algo.update(batches, frames)
            frames += sum(b["rollout"].numel() for b in batches)
            version += 1
            stop = frames >= cfg.collector.total_frames
            started = time.perf_counter()
            publisher.publish(Header(version, frames, stop, algo.values_for_header(frames)))
            metrics["sync/ms"] = 1000 * (time.perf_counter() - started)
            if frames >= next_log or stop:
                now = time.monotonic()
                metrics["collect/frames_per_s"] = (frames - since[1]) / (now - since[0])
                last_row = {**stats.pop(), **metrics, "sync/version": version}
                logger.log(frames, last_row)
                next_log, since = frames + cfg.logger.log_every_frames, (now, frames)
    finally:
        publisher.close()
    return last_row


def connect(cfg: Config, layout: Layout, groups: Groups | None, algo: Algorithm) -> tuple[WeightPublisher, object]:
    """The weight publisher and the batch source of this trainer.

    Order matters: every rank connects the sync group first, then the data
    channel, or two ranks could block on each other's second handshake.
    """
    models = algo.published_models()
    if layout.single_process:
        publisher, subscriber = local_pair(cfg.sync.timeout_s)
        publisher.connect(models, algo.header_values)
        return publisher, InlineCollector(build_collector(cfg, 0, subscriber), subscriber)
    publisher = make_publisher(cfg.sync, layout.rank, groups)
    publisher.connect(models, algo.header_values)
    template = batch_template(models["policy"], algo.spec.obs_shape, cfg.collector.frames_per_batch // cfg.collector.num_envs, cfg.collector.num_envs)
    receiver = BatchReceiver(groups.data, layout.rank, layout.collectors_of(layout.rank), template, cfg.dist_timeout_s)
    return publisher, receiver
