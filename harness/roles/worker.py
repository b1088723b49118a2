"""A supervised collector's worker process (``collector.max_restarts > 0``).

Its collector rank (:mod:`harness.roles.supervisor`) starts it, watches it and
replaces it. It steps the envs with the policy as an in-process collector
does (:func:`harness.roles.collector.collect_loop`); only its two links go
through its rank:

- weights: a shared-memory segment that its rank writes with every version it
  applies (the ``shm`` scheme's transport, so what a worker reads is never
  torn and never older than what it read before);
- batches: its batch lives in shared memory. Over a pipe it says ``batch``
  when the batch is full, and fills it again only after its rank's ``sent``.

Messages, in order: worker ``("ready", spec, batch)``; rank ``(segment name,
header_only)``; then ``batch`` / ``sent`` for every batch; worker ``last`` at
the stop. A worker that fails sends ``("error", what)`` when it still can.
It ignores SIGINT, SIGTERM and SIGUSR1 (its rank decides when the job
stops), and the kernel kills it when its rank's fork server ends
(``PR_SET_PDEATHSIG``), so a worker never outlives its job.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict

from harness.config import Config, plugins
from harness.data.channel import POLL_S
from harness.roles.collector import collect_loop, make_collector, make_periodic_evaluation
from harness.sync import Endpoint
from harness.sync.endpoints import Subscriber
from harness.sync.shared_memory import ShmSource

PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15  # prctl(2)
# Out of memory, the kernel kills the process with the highest score: the worker, which its rank
# replaces (collector.max_restarts), rather than a rank, whose death restarts the whole job. Any
# process may raise its own score (lowering needs CAP_SYS_RESOURCE).
OOM_SCORE_ADJ = 500


def pulse(beat: np.ndarray, every_s: float) -> None:
    """Write the time into ``beat[2]`` every ``every_s``, from a thread of its own, for as long as
    the process lives: its rank sees it alive also between batches, when no env step is watched.
    A stopped worker (SIGSTOP) stops it, and so does one hung holding the GIL."""

    def beating() -> None:
        while True:
            beat[2] = time.monotonic()
            time.sleep(every_s)

    threading.Thread(target=beating, name="pulse", daemon=True).start()


def worker_name(rank: int) -> str:
    """The worker's process name (``ps``, ``/proc/<pid>/comm``; at most 15 bytes)."""
    return f"collector{rank}"[:15]


def become_worker(rank: int, threads: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NAME, worker_name(rank).encode())
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    score = Path("/proc/self/oom_score_adj")
    try:
        score.write_text(str(max(OOM_SCORE_ADJ, int(score.read_text()))))
    except OSError:  # no procfs (not Linux): the kernel's own choice stands
        pass
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, signal.SIG_IGN)
    torch.set_num_threads(threads)
    logging.basicConfig(
        level=logging.WARNING, format=f"collector rank {rank} (worker): %(message)s"
    )


class PipeOutlet:
    """A worker's end of the batch handover: ``batch``, then its rank's ``sent``."""

    def __init__(self, conn: Connection, timeout_s: float):
        self.conn, self.timeout_s = conn, timeout_s

    def send(self, batch: TensorDict, while_waiting: Callable[[], object] | None = None) -> None:
        self.conn.send("batch")
        waited, pause = 0.0, POLL_S[1]
        while not self.conn.poll(pause):  # an EOF (its rank died) ends the wait too: recv raises it
            waited += pause
            if waited > self.timeout_s:
                raise TimeoutError(
                    f"its rank did not take a batch in {self.timeout_s:g} s (dist_timeout_s)"
                )
            if while_waiting is not None:
                pause = POLL_S[0] if while_waiting() else min(2 * pause, POLL_S[1])
        reply = self.conn.recv()
        assert reply == "sent", f"unexpected message from its rank: {reply!r}"

    def send_last(self, batch: TensorDict) -> None:
        self.conn.send("last")


def relay_subscriber(cfg: Config, rank: int, segment: str, header_only: bool) -> Subscriber:
    """A reader of its rank's segment. Its rank checked the schema with trainer 0; the
    segment's size checks this side's."""
    source = ShmSource(cfg.sync.poll_interval_s)
    source.attach(segment)
    endpoint = Endpoint(rank, "collector worker", cfg.sync.name)
    # Its rank checked each version's digest before it wrote it here.
    return Subscriber(endpoint, cfg.sync, source, None, header_only=header_only, verify="off")


def main(
    cfg: Config,
    rank: int,
    incarnation: int,
    evaluates: bool,
    threads: int,
    conn: Connection,
    heartbeat: torch.Tensor,
) -> None:
    """The worker's life: make the envs, say ready, collect until the stop."""
    # A fresh interpreter (spawn): the plugins' algorithms and schemes, as its rank has them.
    plugins.import_plugins()
    become_worker(rank, threads)
    beat: np.ndarray = heartbeat.numpy()
    pulse(beat, min(0.5, cfg.collector.watchdog_s / 4))
    try:
        # The batch in shared memory: its rank sends it.
        collector, models, values, spec = make_collector(cfg, rank, incarnation, shared=True)
        collector.heartbeat = beat
        conn.send(("ready", spec, collector.batch))
        beat[0] = 0.0  # ready: from here on only its steps are watched
        segment, header_only = conn.recv()
        subscriber = relay_subscriber(cfg, rank, segment, header_only)
        subscriber.connect(models, values)
        evaluation = make_periodic_evaluation(cfg, collector, evaluates)
        try:
            collect_loop(
                cfg, rank, collector, subscriber, PipeOutlet(conn, cfg.dist_timeout_s), evaluation
            )
        finally:
            subscriber.close()
            collector.envs.close()
            if evaluation is not None:
                evaluation.close()
    except BaseException as e:
        try:
            conn.send(("error", f"raised {type(e).__name__}: {e}"))
        except OSError:
            pass  # its rank is gone
        raise
