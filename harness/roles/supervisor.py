"""A collector rank that supervises a worker process (``collector.max_restarts > 0``).

torchrun's agent restarts every rank when one exits, so a collector whose env
crashes, which the kernel's OOM killer picks, or which hangs would cost the
whole job. Here the failure stays where torchrun cannot see it: the rank keeps
every process group, the weights subscription and the data channel, and runs
the envs and the policy in a worker process (:mod:`harness.roles.worker`)
that it replaces when it dies or stalls, up to ``collector.max_restarts``
times. Nothing outside the node learns of it: no collective, group or peer
changes, so every weight sync scheme's guarantees hold as they are.

- Weights: the rank's subscriber hands every version it applies to a
  shared-memory segment that its worker reads. A replacement reads the newest
  version there before it acts, so its first batch carries that version, and
  the lag bound holds as for any collector.
- Batches: the worker fills a batch in shared memory; the rank sends those
  bytes to its trainer. A batch counts once it was handed over; the frames of
  an unfinished one (the heartbeat counts them) are reported with the next
  batch (``collect/frames_lost``), as the replacements are
  (``collect/collector_restarts``).
- Watching: the worker's death shows at once (its process sentinel); a stall
  shows in its heartbeat, the time of its last env step, which it writes
  while it collects: a worker that takes no step for ``collector.watchdog_s``
  is killed and replaced, also when the env holds the GIL. Between batches
  (handing one over, evaluating, waiting for weights) no step is due: there a
  thread of the worker's writes its pulse, and one that shows none for
  ``collector.watchdog_s`` (stopped, or hung holding the GIL) is killed and
  replaced once its rank next waits for it.

Past the limit, or when the first worker raises before any batch came (a
replacement would raise the same), the rank raises an error naming the
collector, its env and every cause seen.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from harness.algos import algorithm_for
from harness.collect.watchdog import HUNG_EXIT
from harness.config import Config
from harness.core.packing import pack, schema
from harness.core.specs import EnvSpec
from harness.data.channel import POLL_S, BatchSender
from harness.distributed.setup import Groups
from harness.distributed.topology import Layout
from harness.roles import worker
from harness.roles.collector import evaluates
from harness.roles.pacing import Pacing, stamp_stop_request
from harness.sync import make_subscriber
from harness.sync.endpoints import Subscriber
from harness.sync.shared_memory import ShmSink

log = logging.getLogger("harness")
# What the fork server imports once, so that a replacement starts in a fork.
PRELOAD = ["harness.roles.worker"]
WATCH_S = 0.05  # how often a rank that only waits for its worker looks at its heartbeat
SIGNAL_HINTS = {
    signal.SIGKILL: "kill -9, or the kernel's OOM killer",
    signal.SIGSEGV: "a crash in native code",
    signal.SIGABRT: "an abort: os.abort, or a failed assertion in native code",
    signal.SIGBUS: "a crash in native code",
}


class CollectorFailed(RuntimeError):
    """A supervised collector's worker failed more often than ``collector.max_restarts`` allows."""


def describe_exit(code: int | None, error: str | None) -> str:
    """How a worker ended, from its exit code and its last word."""
    if error:
        return error
    if code is not None and code < 0:
        sig = signal.Signals(-code)
        hint = SIGNAL_HINTS.get(sig)
        return f"was killed by {sig.name}" + (f" ({hint})" if hint else "")
    if code == HUNG_EXIT:
        return (
            "stopped itself: an env step outlasted collector.env_step_timeout_s (its log names "
            "the env)"
        )
    return f"exited with code {code}"


@dataclass
class Incarnation:
    """One worker process."""

    process: mp.process.BaseProcess
    conn: Connection
    # [time of its last env step while collecting (0: not stepping), frames since its last batch,
    # its pulse: the time, written every fraction of a second while it lives (0: not yet)]
    heartbeat: np.ndarray
    started: float  # time.monotonic()
    ready: bool = False


class Supervisor:
    """Starts a collector's worker, takes its batches, and replaces it when it dies or stalls."""

    def __init__(self, cfg: Config, rank: int, first: bool):
        self.cfg, self.rank, self.first = cfg, rank, first
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(PRELOAD)
        self.max_restarts, self.watchdog_s = cfg.collector.max_restarts, cfg.collector.watchdog_s
        # Making the envs: as long as a peer may take to start.
        self.start_s = max(cfg.dist_timeout_s, self.watchdog_s)
        self.restarts = 0
        self.causes: list[str] = []
        self.cause = ""  # how the last worker that failed ended
        self.unreported = [0.0, 0.0]  # restarts and lost frames not yet sent with a batch
        self.delivered = False  # some worker handed over a batch
        # The segment a worker reads weights from, and header_only.
        self.relay: tuple[str, bool] | None = None
        self.died_at: float | None = None  # when the last replaced worker was found dead
        self.batch: TensorDict | None = None
        self.worker = self._spawn()

    @property
    def who(self) -> str:
        return f"collector rank {self.rank} (env {self.cfg.env.id})"

    def _spawn(self) -> Incarnation:
        heartbeat = torch.zeros(3, dtype=torch.float64).share_memory_()
        ours, theirs = self.ctx.Pipe()
        args = (
            self.cfg,
            self.rank,
            self.restarts,
            self.first,
            torch.get_num_threads(),
            theirs,
            heartbeat,
        )
        process = self.ctx.Process(
            target=worker.main, args=args, name=worker.worker_name(self.rank), daemon=True
        )
        process.start()
        theirs.close()
        return Incarnation(process, ours, heartbeat.numpy(), time.monotonic())

    def ready(self) -> EnvSpec:
        """The first worker's envs' spec, once it made them; its batch is ``self.batch``."""
        while (spec := self._ready()) is None:
            self._replace()
        return spec

    def _ready(self) -> EnvSpec | None:
        message = self._receive()
        if message is None:
            return None
        kind, spec, batch = message
        assert kind == "ready", f"unexpected message from the worker: {kind!r}"
        if self.batch is not None and schema(batch) != schema(self.batch):
            raise CollectorFailed(
                f"{self.who}: a replacement worker's batch differs from the first one's"
            )
        self.batch, self.worker.ready = batch, True
        if self.relay is not None:
            self._tell(self.relay)
        return spec

    def attach(self, segment: str, header_only: bool) -> None:
        """Tell workers, this one and every replacement, where the weights are."""
        self.relay = (segment, header_only)
        self._tell(self.relay)

    def _tell(self, message: object) -> None:
        """Send the worker ``message``; if it died meanwhile, the next wait for it finds out."""
        try:
            self.worker.conn.send(message)
        except OSError:
            pass

    def _receive(self, while_waiting: Callable[[], object] | None = None) -> Any:
        """The worker's next message; None when it died or stalled (``self.cause`` says how)."""
        w, pause, error = self.worker, WATCH_S, None
        while True:
            if while_waiting is not None:
                pause = POLL_S[0] if while_waiting() else min(2 * pause, POLL_S[1])
            ready = wait([w.conn, w.process.sentinel], timeout=pause)
            if w.conn in ready:
                try:
                    message = w.conn.recv()
                except (EOFError, OSError):
                    message = None
                if isinstance(message, tuple) and message[0] == "error":
                    error = message[1]  # its last word; its exit follows
                    continue
                if message is not None:
                    return message
            if ready:  # it exited (or closed its end)
                w.process.join(5)
                self.cause = describe_exit(w.process.exitcode, error)
                return None
            if what := self._stalled(w):
                w.process.kill()
                w.process.join(5)
                self.cause = f"{what}; its rank killed it"
                return None

    def _stalled(self, w: Incarnation) -> str | None:
        """How worker ``w`` stalled, if it did: no env step for ``collector.watchdog_s`` while it
        collects, no pulse for as long between batches, or no envs made in ``start_s``."""
        now, step, alive = time.monotonic(), w.heartbeat[0], w.heartbeat[2]
        if not w.ready:
            stalled = now - w.started > self.start_s
            return f"did not make its envs in {self.start_s:g} s" if stalled else None
        if step:  # collecting: its steps say it is alive (its pulse may lag them by 0.5 s)
            stalled = now - step > self.watchdog_s
            return (
                f"took no env step for {self.watchdog_s:g} s (collector.watchdog_s)"
                if stalled
                else None
            )
        if alive and now - alive > self.watchdog_s:
            return (
                f"showed no sign of life for {now - alive:.1f} s between batches (stopped, or hung "
                f"holding the GIL; collector.watchdog_s={self.watchdog_s:g})"
            )
        return None

    def _replace(self) -> None:
        """Start a new worker in place of the one that failed, or give up."""
        old = self.worker
        old.conn.close()
        self.causes.append(self.cause)
        # A worker that raised before any batch: a replacement would raise the same.
        if not self.delivered and self.cause.startswith("raised"):
            raise CollectorFailed(
                f"{self.who}: its worker (pid {old.process.pid}) {self.cause}, before its first "
                "batch"
            )
        if self.restarts >= self.max_restarts:
            causes = "; ".join(f"{i + 1}. {c}" for i, c in enumerate(self.causes))
            raise CollectorFailed(
                f"{self.who}: its worker failed {len(self.causes)} times, more than "
                f"collector.max_restarts={self.max_restarts}. The causes, in order: {causes}"
            )
        lost = float(old.heartbeat[1])
        self.restarts += 1
        self.unreported[0] += 1
        self.unreported[1] += lost
        self.died_at = time.monotonic()
        self.worker = self._spawn()
        log.warning(
            "collector rank %d: its worker (pid %s) %s; replaced by pid %s (restart %d of at most "
            "%d), %d frames of its unfinished batch lost",
            self.rank,
            old.process.pid,
            self.cause,
            self.worker.process.pid,
            self.restarts,
            self.max_restarts,
            lost,
        )

    def take(self, while_waiting: Callable[[], object] | None = None) -> TensorDict | None:
        """The worker's next full batch, stamped with the replacements since the last one; None
        when the worker saw the stop first (async mode: it read it while its rank waited)."""
        while (message := self._receive(while_waiting)) != "batch":
            if message == "last":
                return None
            if message is not None:
                raise CollectorFailed(
                    f"{self.who}: unexpected message from its worker: {message!r}"
                )
            self._replace()
            while self._ready() is None:
                self._replace()
        assert self.batch is not None  # set by the ready message
        if self.died_at is not None:
            log.warning(
                "collector rank %d: the replacement's first batch came %.2f s after its worker's "
                "death was noticed",
                self.rank,
                time.monotonic() - self.died_at,
            )
            self.died_at = None
        stats = self.batch["stats"]
        stats["collector_restarts"].fill_(self.unreported[0])
        stats["frames_lost"].fill_(self.unreported[1])
        self.unreported = [0.0, 0.0]
        self.worker.heartbeat[1] = 0.0  # its frames so far are in this batch
        self.delivered = True
        return self.batch

    def release(self) -> None:
        """The trainer took the batch: the worker may fill it again."""
        self._tell("sent")

    def close(self, timeout_s: float) -> None:
        """The worker's end. After the stop it exits by itself, its last message first: a batch it
        hands over before that (it was collecting when its rank saw the stop) is answered, unsent,
        so that it reads the stop next. One that is not gone within ``timeout_s`` (0 when the rank
        failed) is killed, and so is one that shows no sign of life (a message, an env step) for
        ``collector.watchdog_s``: stopped or hung, it would only hold up the run's end."""
        w, deadline = self.worker, time.monotonic() + timeout_s
        alive_at = time.monotonic()
        while w.process.is_alive() and (left := deadline - time.monotonic()) > 0:
            if w.conn in wait([w.conn, w.process.sentinel], timeout=min(left, 1.0)):
                try:
                    if w.conn.recv() == "batch":
                        self._tell("sent")  # the trainer needs no more batches
                except (EOFError, OSError):
                    break  # it closed its end: it is exiting
                alive_at = time.monotonic()
            alive_at = max(alive_at, float(w.heartbeat[0]))
            if w.process.is_alive() and time.monotonic() - alive_at > self.watchdog_s:
                log.warning(
                    "collector rank %d: its worker (pid %s) neither stepped nor exited for %g s "
                    "after the stop (collector.watchdog_s); its rank killed it",
                    self.rank,
                    w.process.pid,
                    self.watchdog_s,
                )
                deadline = time.monotonic()
        w.process.join(max(deadline - time.monotonic(), 0.0))
        if w.process.is_alive():
            w.process.kill()
            w.process.join(5)
        w.conn.close()


def run_supervised_collector(cfg: Config, layout: Layout, groups: Groups) -> None:
    """:func:`harness.roles.collector.run_collector`'s loop, with the envs in a supervised
    worker."""
    rank = layout.rank
    subscriber = make_subscriber(cfg.sync, rank, groups)
    assert isinstance(subscriber, Subscriber)  # every scheme's ends are endpoints'
    relay = ShmSink(groups.nodes[rank], readers=1)
    subscriber.relay_to(relay)
    supervisor = Supervisor(cfg, rank, evaluates(layout))
    stopped = False
    try:
        spec = supervisor.ready()
        algo = algorithm_for(cfg.algo.name, spec)
        subscriber.connect(algo.make_models(cfg.algo, spec), algo.header_values)
        assert relay.segment is not None  # connect opened it
        supervisor.attach(relay.segment.name, not subscriber.delivers_weights)
        assert supervisor.batch is not None  # ready() set it
        sender = BatchSender(
            groups.data, rank, layout.trainer_of(rank), supervisor.batch, cfg.dist_timeout_s
        )
        pacing = Pacing(cfg, subscriber)
        header = pacing.first()
        while not header.stop:
            batch = supervisor.take(while_waiting=pacing.while_waiting)
            if batch is None:
                break
            stamp_stop_request(batch)  # the worker ignores signals: its rank hears them
            sender.send(batch, while_waiting=pacing.while_waiting)
            supervisor.release()
            header = pacing.next(header)
        # The goodbye goes from a copy: the worker, answered for its last batch, may be filling
        # the shared one again, and would overwrite the goodbye's stats.last (the trainer would
        # take it for one more batch and wait for a goodbye that never comes).
        sender.send_last(pack(supervisor.batch.clone()), *supervisor.unreported)
        stopped = True
    finally:
        supervisor.close(cfg.sync.timeout_s if stopped else 0.0)
        subscriber.close()
