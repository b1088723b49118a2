"""A collector rank: act with the newest weights, send batches to a trainer."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Optional, Protocol

import gymnasium as gym
import torch
from tensordict import TensorDict
from torch import nn

from harness.algos import algorithm_for
from harness.collect.async_rollout import AsyncRolloutCollector
from harness.collect.envpool_envs import EnvpoolEnvs
from harness.collect.envs import make_vec_env, spec_of
from harness.collect.evaluate import Evaluation, PeriodicEvaluation, eval_seed, video_schedule
from harness.collect.rollout import RolloutCollector
from harness.config import Config
from harness.core.specs import EnvSpec
from harness.data.channel import BatchSender
from harness.distributed.setup import Groups
from harness.distributed.topology import Layout
from harness.roles.pacing import Pacing, stamp_stop_request
from harness.sync import WeightSubscriber, make_subscriber

# A replaced worker's seeds move this far per replacement: new episodes, new actions.
REPLACEMENT_SEED = 1_000_003


class Outlet(Protocol):
    """Where a collector's batches go: its trainer (:class:`BatchSender`), or the rank that
    supervises it."""

    def send(
        self, batch: TensorDict, while_waiting: Callable[[], object] | None = None
    ) -> None: ...

    def send_last(self, batch: TensorDict) -> None: ...


def make_collector(
    cfg: Config, rank: int, incarnation: int = 0, shared: bool = False
) -> tuple[RolloutCollector, Mapping[str, nn.Module], Sequence[str], EnvSpec]:
    """Envs and a policy, not yet bound to any weights: the collector, the
    policy's models with the names of the header's values (what a subscriber
    connects), and the envs' spec.

    Rank ``r``'s envs take seeds ``seed + r * num_envs`` onwards, so no two
    envs of a job share a seed and the same seed reproduces the same run. The
    ``incarnation``-th replacement of a supervised worker takes other seeds.
    ``shared``: the batch is in shared memory (a worker's, which its rank sends).
    """
    torch.manual_seed(cfg.seed + rank)  # the models' initial weights: sync=none acts with them
    c = cfg.collector
    shift = REPLACEMENT_SEED * incarnation
    seed = cfg.seed + rank * c.num_envs + shift
    kind: type[RolloutCollector] = RolloutCollector
    envs: gym.vector.VectorEnv | EnvpoolEnvs
    if cfg.env.backend == "envpool":  # one envpool batch on this rank's threads
        envs = EnvpoolEnvs(cfg.env.id, c.num_envs, cfg.env.envpool, torch.get_num_threads(), seed)
        if envs.asynchronous:
            kind = AsyncRolloutCollector
    else:
        envs = make_vec_env(
            cfg.env.id,
            c.num_envs,
            cfg.env.max_episode_steps,
            c.max_env_restarts,
            c.check_obs,
            c.env_step_timeout_s,
        )
    spec = spec_of(envs)  # type: ignore[arg-type]  # EnvpoolEnvs has the spaces it reads
    algo = algorithm_for(cfg.algo.name, spec)
    models = algo.make_models(cfg.algo, spec)
    if incarnation:
        torch.manual_seed(cfg.seed + rank + shift)  # the actions' samples
    policy = algo.acting_policy(models)
    collector = kind(envs, policy, c.frames_per_batch, seed, algo.needs_next_obs, shared)  # type: ignore[arg-type]
    return collector, models, algo.header_values, spec


def build_collector(cfg: Config, rank: int, subscriber: WeightSubscriber) -> RolloutCollector:
    """A collector whose policy's weights (with ``algo.normalize_obs``, also
    the observation statistics) are bound to ``subscriber``'s buffer."""
    collector, models, values, _ = make_collector(cfg, rank)
    subscriber.connect(models, values)
    return collector


def evaluates(layout: Layout) -> bool:
    """Only the first collector evaluates, so each evaluation is counted once
    (and, with ``eval.video_every``, records the videos)."""
    return layout.single_process or layout.rank == layout.trainers


def make_periodic_evaluation(
    cfg: Config, collector: RolloutCollector, first: bool
) -> Optional[PeriodicEvaluation]:
    """``first``: this is the collector that evaluates (:func:`evaluates`)."""
    if not cfg.eval.every_frames or not first:
        return None
    seed = eval_seed(cfg.seed, 0, cfg.eval.episodes)
    videos = video_schedule(cfg.run_dir, cfg.eval.video_every)
    envs = None
    if cfg.env.backend == "envpool":  # envpool's env, reward_clip off, a game per episode
        options = dataclasses.replace(cfg.env.envpool, batch_size=0)
        envs = EnvpoolEnvs(
            cfg.env.id, cfg.eval.episodes, options, torch.get_num_threads(), seed, training=False
        )
    evaluation = Evaluation(
        cfg.env.id,
        cfg.env.max_episode_steps,
        cfg.eval.episodes,
        collector.policy,
        seed,
        videos,
        envs,  # type: ignore[arg-type]
    )
    return PeriodicEvaluation(evaluation, cfg.eval.every_frames)


def collect_loop(
    cfg: Config,
    rank: int,
    collector: RolloutCollector,
    subscriber: WeightSubscriber,
    outlet: Outlet,
    evaluation: Optional[PeriodicEvaluation],
) -> None:
    """Batches acted with the weights :class:`~harness.roles.pacing.Pacing` names, into
    ``outlet``, until the trainer's stop."""
    pacing = Pacing(cfg, subscriber)
    header = pacing.first()
    # A resumed run, or a replaced worker: new episodes, not a replay of earlier ones.
    if header.frames:
        collector.reset(collector.seed + header.frames)
    waited_s = 0.0
    while not header.stop:
        if pacing.streaming:  # the newest weights before every env step
            batch = collector.collect(header, refresh=pacing.newest)
        else:
            batch = collector.collect(header)
        if evaluation is not None:
            if pacing.streaming:  # no wait to hide it in: it holds up this batch
                evaluation.run_if_due(subscriber.current_header())
            evaluation.stamp(batch)
        stamp_stop_request(batch)
        batch["stats", "wait_s"].fill_(waited_s)
        waiting_since = time.perf_counter()
        outlet.send(batch, while_waiting=pacing.while_waiting)
        if evaluation is not None and not pacing.streaming:
            # While the trainer learns from the batch (weights change only in the wait); the
            # result rides on the next batch.
            waiting_since += evaluation.run_if_due(header)
        header = pacing.next(header)
        waited_s = time.perf_counter() - waiting_since
    outlet.send_last(collector.batch)


def run_collector(cfg: Config, layout: Layout, groups: Groups) -> None:
    subscriber = make_subscriber(cfg.sync, layout.rank, groups)
    collector = build_collector(cfg, layout.rank, subscriber)
    sender = BatchSender(
        groups.data,
        layout.rank,
        layout.trainer_of(layout.rank),
        collector.batch,
        cfg.dist_timeout_s,
    )
    evaluation = make_periodic_evaluation(cfg, collector, evaluates(layout))
    try:
        collect_loop(cfg, layout.rank, collector, subscriber, sender, evaluation)
    finally:
        subscriber.close()
        collector.envs.close()
        if evaluation is not None:
            evaluation.close()
