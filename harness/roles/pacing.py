"""Which weights a collector acts with, and when it waits for newer ones: the rules every
collecting rank follows, whether it steps the envs itself
(:func:`~harness.roles.collector.collect_loop`, in a supervised worker too) or hands on its
worker's batches (:mod:`harness.roles.supervisor`).

- The first batch waits for trainer 0's first publish (version 0, or where a resumed run stands).
- Sync rounds: after handing over a batch the rank waits for the next version, so that every
  batch of round r was acted with version r. Pipelined (``collector.pipeline``), the first two
  rounds share the first version: round r + 1 is acted with version r while the trainer learns on
  round r.
- Async (streaming): the rank never waits for a version; it acts with the newest there is, and
  takes newer ones while a send waits.
- Trainer 0's stop rides on a header: a rank collects until the header it holds carries it.
- Every batch carries the rank's own stop request (a signal), for the trainers to agree on.
"""

from __future__ import annotations

from collections.abc import Callable

from tensordict import TensorDict

from harness.config import Config
from harness.distributed import signals
from harness.sync import Header, WeightSubscriber


class Pacing:
    """The version rules above, for one collecting rank's ``subscriber``."""

    def __init__(self, cfg: Config, subscriber: WeightSubscriber):
        self.subscriber = subscriber
        self.streaming = cfg.collector.mode == "async"
        self.pipeline = cfg.collector.pipeline
        self.first_round = True

    def first(self) -> Header:
        """The version the first batch is acted with: trainer 0's first publish."""
        return self.subscriber.wait(min_version=0)

    def newest(self) -> Header:
        """The newest version there is, without waiting (streaming)."""
        return self.subscriber.poll() or self.subscriber.current_header()

    @property
    def while_waiting(self) -> Callable[[], object] | None:
        """What a waiting send does meanwhile: streaming, take newer weights; in sync rounds
        nothing (weights change only between rounds)."""
        return self.subscriber.poll if self.streaming else None

    def next(self, header: Header) -> Header:
        """The version the next batch is acted with, once the one acted with ``header`` was
        handed over."""
        if self.streaming:
            return self.newest()
        again, self.first_round = self.pipeline and self.first_round, False
        return self.subscriber.wait(min_version=header.version if again else header.version + 1)


def stamp_stop_request(batch: TensorDict) -> None:
    """``batch`` carries whether this rank was asked to stop (a signal: only ranks hear them)."""
    batch["stats", "preempt"].fill_(signals.requested())
