"""The three loops that drive a trainer, one per kind of run.

A loop is control flow only: it decides *when* to receive, learn and publish,
and reaches the trainer through :class:`TrainerSteps` alone. Every update goes
``ready`` (its input in hand; several trainers meet here), ``update``,
``learned`` (counted), then maybe ``publish``, then ``end_update`` (the safe
point: checkpoints, log rows). Each loop runs until ``stopping`` (budget spent,
or asked to stop); :meth:`~harness.roles.trainer.Trainer.run` then ends the run.
The run's kind picks the loop and its settings (:meth:`~harness.roles.kinds.RunKind.loop`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

import torch
from tensordict import TensorDict


class TrainerSteps(Protocol):
    """What a loop may ask of a trainer (:class:`~harness.roles.trainer.Trainer` is one)."""

    @property
    def stopping(self) -> bool:
        """The budget is spent, or a trainer was asked to stop: no update after this one."""

    @property
    def done(self) -> bool:
        """The budget is spent."""

    @property
    def updates(self) -> int:
        """Updates learned so far (a resumed run's included)."""

    def receive(self) -> list[TensorDict]:
        """One batch from every collector of this trainer (a sync round)."""

    def receive_fresh(self) -> TensorDict:
        """The next batch none of whose frames is older than ``collector.max_policy_lag``
        versions."""

    def ready(self, batches: list[TensorDict]) -> None:
        """This update's input is in hand (counted in the statistics); several trainers meet."""

    def update(self, batches: list[TensorDict]) -> Mapping[str, torch.Tensor | float]:
        """The algorithm learns from ``batches``."""

    def learned(self, frames: int) -> None:
        """Count an update on ``frames`` new frames (of every trainer)."""

    def publish(self) -> float:
        """Send the current weights as a new version; returns milliseconds."""

    def evaluations(self, wait: bool) -> None:
        """Offline: take the collectors' evaluations; with ``wait``, those of the newest version
        first."""

    def end_update(self, metrics: Mapping[str, torch.Tensor | float], sync_ms: float) -> None:
        """The safe point between updates: checkpoint when due or asked, a log row when due."""


def sync_rounds(trainer: TrainerSteps, frames_per_round: int, pipeline: bool) -> None:
    """Rounds: every collector's batch of round r was acted with version r
    (r - 1 when pipelined); the trainer learns once per round."""
    sync_ms, rounds = 0.0, 0
    while not trainer.stopping:
        batches = trainer.receive()
        rounds += 1
        if pipeline and rounds > 1:
            # Only now that round r is in may version r go out: collectors act on
            # round r + 1 with it while we learn on round r, and no sooner.
            sync_ms = trainer.publish()
        trainer.ready(batches)
        metrics = trainer.update(batches)
        trainer.learned(frames_per_round)
        if not pipeline and not trainer.stopping:
            sync_ms = trainer.publish()
        trainer.end_update(metrics, sync_ms)


def async_stream(
    trainer: TrainerSteps, trainers: int, publish_every: int, per_update: int = 1
) -> None:
    """Streaming: learn from each ``per_update`` fresh batches as they come, from
    whichever collectors send first, and publish every ``publish_every`` updates.
    With T trainers an update is that on each: T times its frames, the same
    gradient steps on every trainer, and the same version count, which only
    trainer 0 publishes."""
    sync_ms = 0.0
    while not trainer.stopping:
        # Each received batch is valid until the next receive: all but the last are copied.
        batches = [trainer.receive_fresh().clone() for _ in range(per_update - 1)] + [
            trainer.receive_fresh()
        ]
        trainer.ready(batches)
        metrics = trainer.update(batches)
        trainer.learned(sum(batch["rollout"].numel() for batch in batches) * trainers)
        if trainer.updates % publish_every == 0 and not trainer.stopping:
            sync_ms = trainer.publish()
        trainer.end_update(metrics, sync_ms)


def publish_due(updates: int, every: int, silent_s: float, wait_bound_s: float) -> bool:
    """Every ``every`` updates, and whenever the trainer has been silent for half
    of what its evaluators (and it, for their reports) wait before giving up:
    a step slow enough to stretch ``every`` updates past that bound (5,000 CQL
    steps on a CPU) makes a slow run, not a dead one."""
    return updates % every == 0 or silent_s > wait_bound_s / 2


def offline_steps(trainer: TrainerSteps, publish_every: int, wait_bound_s: float) -> None:
    """Gradient steps on the dataset; publish every ``publish_every`` steps
    (sooner if steps are slow: :func:`publish_due`), and the final weights, for
    the collectors to evaluate; the last row waits for their evaluation."""
    sync_ms, published_at = 0.0, time.monotonic()
    while not trainer.stopping:
        trainer.ready([])
        metrics = trainer.update([])
        trainer.learned(0)
        silent_s = time.monotonic() - published_at
        if publish_due(trainer.updates, publish_every, silent_s, wait_bound_s) or trainer.stopping:
            sync_ms, published_at = trainer.publish(), time.monotonic()
        trainer.evaluations(wait=trainer.done)
        trainer.end_update(metrics, sync_ms)
