"""A collector rank: act with the newest weights, send batches to a trainer."""

from __future__ import annotations

import time
from typing import Optional

import torch

from harness.algos import algorithm_for
from harness.collect.envs import make_vec_env, spec_of
from harness.collect.evaluate import Evaluation, PeriodicEvaluation, eval_seed, video_schedule
from harness.collect.rollout import RolloutCollector
from harness.config import Config
from harness.data.channel import BatchSender
from harness.distributed import signals
from harness.distributed.setup import Groups
from harness.distributed.topology import Layout
from harness.sync import WeightSubscriber, make_subscriber


def build_collector(cfg: Config, rank: int, subscriber: WeightSubscriber) -> RolloutCollector:
    """Envs and a policy whose weights (with ``algo.normalize_obs``, also the
    observation statistics) are bound to ``subscriber``'s buffer.

    Rank ``r``'s envs take seeds ``seed + r * num_envs`` onwards, so no two
    envs of a job share a seed and the same seed reproduces the same run.
    """
    torch.manual_seed(cfg.seed + rank)
    c = cfg.collector
    envs = make_vec_env(cfg.env.id, c.num_envs, cfg.env.max_episode_steps, c.max_env_restarts, c.check_obs, c.env_step_timeout_s)
    algo = algorithm_for(cfg.algo.name, spec_of(envs))
    models = algo.make_models(cfg.algo, spec_of(envs))
    subscriber.connect(models, algo.header_values)
    seed = cfg.seed + rank * cfg.collector.num_envs
    return RolloutCollector(envs, algo.acting_policy(models), cfg.collector.frames_per_batch, seed, algo.needs_next_obs)


def make_periodic_evaluation(cfg: Config, layout: Layout, collector: RolloutCollector) -> Optional[PeriodicEvaluation]:
    """Only the first collector evaluates, so each evaluation is counted once
    (and, with ``eval.video_every``, records the videos)."""
    if not cfg.eval.every_frames or not (layout.single_process or layout.rank == layout.trainers):
        return None
    seed = eval_seed(cfg.seed, 0, cfg.eval.episodes)
    videos = video_schedule(cfg.run_dir, cfg.eval.video_every)
    evaluation = Evaluation(cfg.env.id, cfg.env.max_episode_steps, cfg.eval.episodes, collector.policy, seed, videos)
    return PeriodicEvaluation(evaluation, cfg.eval.every_frames)


def run_collector(cfg: Config, layout: Layout, groups: Groups) -> None:
    subscriber = make_subscriber(cfg.sync, layout.rank, groups)
    collector = build_collector(cfg, layout.rank, subscriber)
    sender = BatchSender(groups.data, layout.rank, layout.trainer_of(layout.rank), collector.batch, cfg.dist_timeout_s)
    evaluation = make_periodic_evaluation(cfg, layout, collector)
    streaming = cfg.collector.mode == "async"
    try:
        header = subscriber.wait(min_version=0)
        if header.frames:  # a resumed run: new episodes, not a replay of the first run's
            collector.reset(cfg.seed + layout.rank * cfg.collector.num_envs + header.frames)
        first_round, waited_s = True, 0.0
        while not header.stop:
            if streaming:  # the newest weights before every env step
                batch = collector.collect(header, refresh=lambda: subscriber.poll() or subscriber.current_header())
            else:
                batch = collector.collect(header)
            if evaluation is not None:
                evaluation.maybe_run(batch, subscriber.current_header())
            batch["stats", "preempt"].fill_(signals.requested())
            batch["stats", "wait_s"].fill_(waited_s)
            waiting_since = time.perf_counter()
            if streaming:
                sender.send(batch, while_waiting=subscriber.poll)
                header = subscriber.poll() or subscriber.current_header()
            else:
                sender.send(batch)
                # The next version; pipelined, the first two rounds share one.
                again = cfg.collector.pipeline and first_round
                header = subscriber.wait(min_version=header.version if again else header.version + 1)
            first_round, waited_s = False, time.perf_counter() - waiting_since
        sender.send_last(collector.batch)
    finally:
        subscriber.close()
        collector.envs.close()
        if evaluation is not None:
            evaluation.close()
