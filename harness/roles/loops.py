"""The three loops that drive a trainer, one per kind of run.

Each takes a :class:`~harness.roles.trainer.Trainer` and runs until it is
``stopping`` (budget spent or preempted); the trainer then publishes the stop.
Every update goes ``ready`` (its input in hand; several trainers meet here),
``update``, ``learned``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Mapping

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from harness.roles.sources import BatchSource
    from harness.roles.trainer import Trainer


def sync_rounds(trainer: Trainer) -> None:
    """Rounds: every collector's batch of round r was acted with version r
    (r - 1 when pipelined); the trainer learns once per round."""
    cfg, progress, source = trainer.cfg.collector, trainer.progress, trainer.connected.batches
    assert source is not None
    frames_per_round = cfg.frames_per_batch * max(len(trainer.layout.collector_ranks), 1)
    sync_ms, rounds = 0.0, 0
    while not trainer.stopping:
        batches = source.receive()
        rounds += 1
        if cfg.pipeline and rounds > 1:
            # Only now that round r is in may version r go out: collectors act on
            # round r + 1 with it while we learn on round r, and no sooner.
            sync_ms = trainer.publish()
        for batch in batches:
            trainer.stats.add(batch, progress.version)
        trainer.ready(batches)
        metrics = trainer.algo.update(batches, progress.frames)
        progress.version += 1
        trainer.learned(frames_per_round)
        if not cfg.pipeline and not trainer.stopping:
            sync_ms = trainer.publish()
        trainer.log(metrics, sync_ms)


def fresh_batch(trainer: Trainer, source: BatchSource) -> TensorDict:
    """The next batch from this trainer's collectors with no frame more than
    ``collector.max_policy_lag`` versions old; older ones are dropped (and
    counted). With several trainers the version stands still while one waits
    here (the others wait for it in ``ready``), so a collector's next batch
    is fresh and no trainer waits long."""
    progress, max_lag = trainer.progress, trainer.cfg.collector.max_policy_lag
    while True:
        batch = source.receive_any()
        if progress.version - int(batch["rollout", "policy_version"].min()) <= max_lag:
            trainer.stats.add(batch, progress.version)
            return batch
        trainer.stats.add(batch, progress.version, dropped=True)


def async_stream(trainer: Trainer) -> None:
    """Streaming: learn from each batch as it comes, publish every
    ``sync.publish_every_updates`` updates, drop batches with frames more
    than ``collector.max_policy_lag`` versions old. With T trainers an update
    is one fresh batch on each: T times its frames, the same gradient steps
    on every trainer, and the same version count, which only trainer 0
    publishes."""
    progress, source = trainer.progress, trainer.connected.batches
    assert source is not None
    sync_ms = 0.0
    metrics: Mapping[str, torch.Tensor | float] = {}
    while not trainer.stopping:
        batch = fresh_batch(trainer, source)
        trainer.ready([batch])
        metrics = trainer.algo.update([batch], progress.frames)
        trainer.learned(batch["rollout"].numel() * trainer.layout.trainers)
        if progress.updates % trainer.cfg.sync.publish_every_updates == 0 and not trainer.stopping:
            progress.version += 1
            sync_ms = trainer.publish()
        trainer.log(metrics, sync_ms)


def publish_due(updates: int, every: int, silent_s: float, wait_bound_s: float) -> bool:
    """Every ``every`` updates, and whenever the trainer has been silent for half
    of what its evaluators (and it, for their reports) wait before giving up:
    a step slow enough to stretch ``every`` updates past that bound (5,000 CQL
    steps on a CPU) makes a slow run, not a dead one."""
    return updates % every == 0 or silent_s > wait_bound_s / 2


def offline_steps(trainer: Trainer) -> None:
    """Gradient steps on the dataset; publish every ``sync.publish_every_updates``
    steps (sooner if steps are slow: :func:`publish_due`) for the collectors to
    evaluate; log what they report. The last row waits for the final weights'
    evaluation."""
    progress, source, cfg = trainer.progress, trainer.connected.evaluations, trainer.cfg
    assert source is not None
    sync_ms, published_at = 0.0, time.monotonic()
    wait_bound_s = min(cfg.sync.timeout_s, cfg.dist_timeout_s)
    metrics: Mapping[str, torch.Tensor | float] = {}
    while not trainer.stopping:
        trainer.ready([])
        metrics = trainer.algo.update([], progress.frames)
        trainer.learned(0)
        silent_s = time.monotonic() - published_at
        if publish_due(progress.updates, cfg.sync.publish_every_updates, silent_s, wait_bound_s) or trainer.stopping:
            progress.version += 1
            sync_ms, published_at = trainer.publish(), time.monotonic()
        if trainer.done:
            source.wait_for(progress.version, cfg.dist_timeout_s)
        trainer.eval_stats.add(source.take())
        trainer.log(metrics, sync_ms)


def for_run(offline: bool, mode: str) -> Callable[[Trainer], None]:
    if offline:
        return offline_steps
    return async_stream if mode == "async" else sync_rounds
