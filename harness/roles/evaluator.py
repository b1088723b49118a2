"""Evaluation as a role: an offline run's collector rank, and the final
weights of an online run.

An offline run's collector takes the newest published weights, runs
``eval.episodes`` deterministic episodes, sends the result to its trainer (a
tiny message on the data channel) and waits for the next version. The trainer receives these with
:class:`~harness.roles.sources.RemoteEvaluations`.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from harness.algos import algorithm_for
from harness.algos.base import Algorithm
from harness.collect.evaluate import Evaluation, eval_seed, video_schedule
from harness.collect.rollout import STATS
from harness.config import Config
from harness.core.packing import pack
from harness.data.channel import BatchSender
from harness.distributed import signals
from harness.distributed.setup import Groups
from harness.distributed.topology import Layout
from harness.metrics.stats import EvalResult
from harness.sync import Header, WeightSubscriber, make_subscriber


def eval_message() -> TensorDict:
    """One evaluation: the version evaluated, by which rank, and the stats
    fields every data-channel message has (``eval_*``, ``preempt``, ``last``)."""
    stats = TensorDict({k: torch.zeros((), dtype=torch.float64) for k in STATS})
    return pack(
        TensorDict(
            stats=stats,
            version=torch.zeros((), dtype=torch.int64),
            rank=torch.zeros((), dtype=torch.int64),
        )
    )


def make_evaluation(cfg: Config, rank: int, subscriber: WeightSubscriber) -> Evaluation:
    """``eval.episodes`` envs and a policy that ``subscriber`` keeps current."""
    spec = cfg.env.spec()
    algo = algorithm_for(cfg.algo.name, spec)
    models = algo.make_models(cfg.algo, spec)
    subscriber.connect(models, algo.header_values)
    policy = algo.acting_policy(models)
    evaluator = max(rank - cfg.topology.trainers, 0)  # 0: the first collector, or a single process
    seed = eval_seed(cfg.seed, evaluator, cfg.eval.episodes)
    videos = video_schedule(cfg.run_dir, cfg.eval.video_every) if evaluator == 0 else None
    return Evaluation(
        cfg.env.id, cfg.env.max_episode_steps, cfg.eval.episodes, policy, seed, videos
    )


def evaluate_final(cfg: Config, algo: Algorithm, header: Header) -> EvalResult:
    """The weights an online run ends with, evaluated in trainer 0's process
    on the first evaluator's episodes (those of its periodic evaluations and
    of ``harness evaluate``): the run's last row scores what it hands over,
    whatever ``eval.every_frames`` is. A CPU copy, wherever the trainer learns."""
    models = type(algo).make_models(cfg.algo, algo.spec)
    for name, model in algo.published_models().items():
        models[name].load_state_dict(model.state_dict())
    seed = eval_seed(cfg.seed, 0, cfg.eval.episodes)
    evaluation = Evaluation(
        cfg.env.id,
        cfg.env.max_episode_steps,
        cfg.eval.episodes,
        type(algo).acting_policy(models),
        seed,
    )
    try:
        return evaluation(header)
    finally:
        evaluation.close()


def run_evaluator(cfg: Config, layout: Layout, groups: Groups) -> None:
    subscriber = make_subscriber(cfg.sync, layout.rank, groups)
    evaluation = make_evaluation(cfg, layout.rank, subscriber)
    message = eval_message()
    sender = BatchSender(
        groups.data, layout.rank, layout.trainer_of(layout.rank), message, cfg.dist_timeout_s
    )
    try:
        header = subscriber.wait(min_version=0)
        while not header.stop:
            result = evaluation(header)
            result.stamp(message["stats"])
            message["stats", "preempt"].fill_(signals.requested())
            message["version"].fill_(header.version)
            message["rank"].fill_(layout.rank)
            sender.send(message, while_waiting=subscriber.poll)
            header = subscriber.wait(min_version=header.version + 1)
        sender.send_last(message)
    finally:
        subscriber.close()
        evaluation.close()
