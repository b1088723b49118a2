"""Where a trainer's input comes from.

An online trainer takes batches (:class:`BatchSource`): from its collectors
over the data channel (:class:`~harness.data.channel.BatchReceiver`), or, in
a single-process run, from a collector in its own process
(:class:`InlineCollector`). An offline trainer takes evaluation results
(:class:`EvaluationSource`): from its collectors, received by a helper thread
(:class:`RemoteEvaluations`), or evaluated in its own process
(:class:`InlineEvaluations`). The run's kind (:mod:`harness.roles.kinds`) connects
the one it learns from: :func:`connect_batches` or :func:`connect_evaluations`.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Optional, Protocol

import torch.distributed as dist
from tensordict import TensorDict

from harness.algos import Algorithm
from harness.collect.evaluate import Evaluation, PeriodicEvaluation
from harness.collect.rollout import RolloutCollector, batch_template
from harness.config import Config
from harness.data.channel import BatchReceiver, ChannelError
from harness.data.joined import CONFIG, HEADER_ONLY, PREFIX, JoinDesk
from harness.distributed.setup import Groups
from harness.distributed.topology import Layout
from harness.metrics.stats import EvalResult
from harness.roles.collector import build_collector, evaluates, make_periodic_evaluation
from harness.roles.evaluator import eval_message, make_evaluation
from harness.sync import WeightPublisher, WeightSubscriber, make_publisher
from harness.sync.endpoints import Publisher
from harness.sync.local import local_pair
from harness.sync.store import StoreSink

log = logging.getLogger("harness")
# What a trainer does with each message a drain takes (it counts the faults reported).
Seen = Callable[[TensorDict], object]


class BatchSource(Protocol):
    """Collectors' batches, each valid until the next call."""

    def receive(self) -> list[TensorDict]:
        """One batch from every collector (sync rounds), in collector order."""

    def receive_any(self) -> TensorDict:
        """The next batch from whichever collector sends first (async streaming)."""

    def drain(self, seen: Seen, timeout_s: float | None = None) -> int:
        """After the stop: take what is still in flight until every collector
        said goodbye, handing each message to ``seen``; returns how many batches
        were discarded. ``timeout_s``: the longest to wait for each message, when shorter than
        ``dist_timeout_s``."""


class EvaluationSource(Protocol):
    """Evaluations of published versions, for an offline trainer."""

    def take(self) -> list[EvalResult]:
        """The evaluations that arrived since the last call; never blocks."""

    def wait_for(self, version: int, timeout_s: float) -> None:
        """Until every evaluator evaluated ``version`` or newer."""

    def drain(self) -> int:
        """After the stop: until every evaluator said goodbye."""


class InlineCollector:
    """World size 1: the trainer's own process collects each batch."""

    def __init__(
        self,
        collector: RolloutCollector,
        subscriber: WeightSubscriber,
        evaluation: Optional[PeriodicEvaluation],
    ):
        self.collector, self.subscriber, self.evaluation = collector, subscriber, evaluation

    def receive(self) -> list[TensorDict]:
        return [self.receive_any()]

    def receive_any(self) -> TensorDict:
        self.subscriber.poll()
        # Trainer 0 published version 0 first.
        batch = self.collector.collect(self.subscriber.current_header())
        if self.evaluation is not None:
            self.evaluation.maybe_run(batch, self.subscriber.current_header())
        return batch

    def drain(self, seen: Seen, timeout_s: float | None = None) -> int:
        self.collector.envs.close()
        if self.evaluation is not None:
            self.evaluation.close()
        return 0


class InlineEvaluations:
    """World size 1: the trainer's own process evaluates each new version."""

    def __init__(self, evaluation: Evaluation, subscriber: WeightSubscriber):
        self.evaluation, self.subscriber = evaluation, subscriber

    def take(self) -> list[EvalResult]:
        header = self.subscriber.poll()
        if header is None or header.stop:
            return []
        return [self.evaluation(header)]

    def wait_for(self, version: int, timeout_s: float) -> None:
        pass  # take() evaluates every version as soon as it is published

    def drain(self) -> int:
        self.evaluation.close()
        return 0


class RemoteEvaluations:
    """Collectors' evaluation messages, received by a helper thread so that
    gradient steps never wait: Gloo's point-to-point receives cannot be
    polled, only waited on."""

    def __init__(self, receiver: BatchReceiver):
        self.receiver = receiver
        self.cond = threading.Condition()
        self.results: list[EvalResult] = []
        # The newest version each collector evaluated.
        self.newest = {c: -1 for c in receiver.collectors}
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._receive, name="eval-receive", daemon=True)
        self.thread.start()

    def _receive(self) -> None:
        try:
            while len(self.receiver.finished) < len(self.receiver.collectors):
                message = self.receiver.receive_any()
                with self.cond:
                    if not float(message["stats", "last"]):
                        stats, version = message["stats"], int(message["version"])
                        self.results.append(EvalResult.read(version, stats))
                        self.newest[int(message["rank"])] = version
                    self.cond.notify_all()
        except BaseException as e:  # handed to the trainer's thread
            with self.cond:
                self.error = e
                self.cond.notify_all()

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def take(self) -> list[EvalResult]:
        with self.cond:
            self._check()
            results, self.results = self.results, []
            return results

    def wait_for(self, version: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while min(self.newest.values()) < version:
                self._check()
                if not self.cond.wait(timeout=max(deadline - time.monotonic(), 0)):
                    late = [c for c, v in self.newest.items() if v < version]
                    raise ChannelError(
                        f"collector ranks {late} did not evaluate version {version} within "
                        f"{timeout_s:g} s"
                    )
            self._check()

    def drain(self) -> int:
        self.thread.join(timeout=self.receiver.timeout_s + 5)
        self._check()
        if self.thread.is_alive():
            raise ChannelError("collectors did not finish their last evaluation in time")
        return 0


class JoinedBatches:
    """The data channel's batches, and between them those of collectors that joined the running
    job (:mod:`harness.data.joined`), which its own collectors' keep coming (async mode)."""

    def __init__(self, receiver: BatchReceiver, desk: JoinDesk):
        self.receiver, self.desk = receiver, desk

    def receive(self) -> list[TensorDict]:
        return self.receiver.receive()  # sync rounds: joining is refused with them

    def receive_any(self) -> TensorDict:
        batch = self.desk.poll()
        return self.receiver.receive_any() if batch is None else batch

    def drain(self, seen: Seen, timeout_s: float | None = None) -> int:
        discarded = self.receiver.drain(seen, timeout_s)
        self.desk.close()
        return discarded


def open_join_desk(cfg: Config, publisher: WeightPublisher, template: TensorDict) -> JoinDesk:
    """Trainer 0's join store on ``topology.join_port``: the job's config, its weights, and the
    collectors' numbers."""
    port = cfg.topology.join_port
    try:
        server = dist.TCPStore(
            socket.gethostname(),
            port,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=60),
        )
    except RuntimeError as e:
        raise RuntimeError(
            f"topology.join_port={port}: trainer 0 cannot listen there ({e}); choose a free port"
        ) from e
    store = dist.PrefixStore(PREFIX, server)
    store.set(CONFIG, (Path(cfg.run_dir or ".") / "config.yaml").read_text())
    store.set(HEADER_ONLY, "0" if publisher.delivers_weights else "1")
    assert isinstance(publisher, Publisher)  # every scheme's trainer end is endpoints'
    publisher.add_sink(StoreSink(store))
    log.info("collectors may join: harness join %s:%d", socket.getfqdn(), port)
    return JoinDesk(store, template, cfg.dist_timeout_s, server)


@dataclass
class Connected:
    """What a trainer is connected to: the weight publisher (trainer 0's;
    None on other trainers) and one source, of batches or of evaluations."""

    publisher: Optional[WeightPublisher]
    batches: Optional[BatchSource] = None
    evaluations: Optional[EvaluationSource] = None

    def drain(self, seen: Seen, timeout_s: float | None = None) -> None:
        """After the stop: each collector's goodbye, and what came before it (to ``seen``)."""
        if self.batches is not None:
            self.batches.drain(seen, timeout_s)
        else:
            assert self.evaluations is not None
            self.evaluations.drain()


def connect_batches(
    cfg: Config, layout: Layout, groups: Optional[Groups], algo: Algorithm, frames: int = 0
) -> Connected:
    """Trainer 0's weight publisher, and this trainer's collectors' batches (an online run's).
    ``frames``: where a resumed run stands."""
    if layout.single_process:
        local, subscriber = local_publisher(cfg, algo)
        collector = build_collector(cfg, 0, subscriber)
        if frames:
            collector.reset(cfg.seed + frames)  # a resumed run: new episodes, not a replay
        evaluation = make_periodic_evaluation(cfg, collector, evaluates(layout))
        return Connected(local, batches=InlineCollector(collector, subscriber, evaluation))
    steps = cfg.collector.frames_per_batch // cfg.collector.num_envs
    policy, spec = algo.acting_policy(algo.published_models()), algo.spec
    template = batch_template(
        policy, spec.obs_shape, steps, cfg.collector.num_envs, algo.needs_next_obs, spec.obs_dtype
    )
    publisher, desk, receiver = connect_channel(cfg, layout, groups, algo, template)
    return Connected(publisher, batches=receiver if desk is None else JoinedBatches(receiver, desk))


def connect_evaluations(
    cfg: Config, layout: Layout, groups: Optional[Groups], algo: Algorithm
) -> Connected:
    """Trainer 0's weight publisher, and the evaluations of what it publishes (an offline run's:
    its collectors only evaluate)."""
    if layout.single_process:
        local, subscriber = local_publisher(cfg, algo)
        evaluation = make_evaluation(cfg, 0, subscriber)
        return Connected(local, evaluations=InlineEvaluations(evaluation, subscriber))
    publisher, desk, receiver = connect_channel(cfg, layout, groups, algo, eval_message())
    assert desk is None  # Config refuses collectors that join a run of a dataset
    return Connected(publisher, evaluations=RemoteEvaluations(receiver))


def local_publisher(cfg: Config, algo: Algorithm) -> tuple[WeightPublisher, WeightSubscriber]:
    """World size 1: the publisher, connected, and the subscriber of the collector (or evaluator)
    in the trainer's own process."""
    publisher, subscriber = local_pair(cfg.sync.timeout_s)
    publisher.connect(algo.published_models(), algo.header_values)
    return publisher, subscriber


def connect_channel(
    cfg: Config, layout: Layout, groups: Optional[Groups], algo: Algorithm, template: TensorDict
) -> tuple[Optional[WeightPublisher], Optional[JoinDesk], BatchReceiver]:
    """Trainer 0's weight publisher (with its join desk where ``topology.join_port`` asks for one),
    then this trainer's end of the data channel, whose messages are like ``template``.

    Order matters: every rank connects the sync group first, then the data
    channel, or two ranks could block on each other's second handshake.
    """
    assert groups is not None  # several processes
    publisher, desk = None, None
    if layout.rank == 0:
        publisher = make_publisher(cfg.sync, layout.rank, groups)
        if cfg.topology.join_port:
            desk = open_join_desk(cfg, publisher, template)
        publisher.connect(algo.published_models(), algo.header_values)
    collectors = layout.collectors_of(layout.rank)
    receiver = BatchReceiver(
        groups.data, layout.rank, collectors, template, cfg.dist_timeout_s, cfg.dist_late_s
    )
    return publisher, desk, receiver
