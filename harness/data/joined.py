"""Batches from collectors that joined a running job (``topology.join_port``;
:mod:`harness.cli.join`).

The job's process groups are fixed when it starts, so a collector of another
launch cannot enter them. Trainer 0 keeps a TCP store on the join port
(:class:`JoinDesk`); a collector that joins takes a number from it, says the
layout of its batches, and, once the trainer accepts it, makes a Gloo group
of two with the trainer, its own, over which its batches travel as they do
on the data channel (one packed buffer, one batch in flight). A helper thread
of the trainer receives each joined collector's batches, so the trainer
loop only looks for one between its own collectors' batches; a collector
that leaves (its final message), dies or falls silent for ``dist_timeout_s``
is dropped, its group with it, and nothing else changes.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import cast

import torch.distributed as dist
from tensordict import TensorDict

from harness.core.packing import buffer_of, pack, schema
from harness.data.channel import ChannelError, send_while

log = logging.getLogger("harness")
PREFIX = "harness/join/"
CONFIG, COUNT = "config", "count"  # keys of the join store: the job's config.yaml, joiners so far
HEADER_ONLY = "header_only"  # and "1" where only headers travel (sync=none)
LOOK_S = 0.2  # how often trainer 0 looks for collectors that want to join


def hello_key(number: int) -> str:
    return f"{number}/hello"


def answer_key(number: int) -> str:
    return f"{number}/answer"


def pair_group(store: dist.Store, number: int, rank: int, timeout_s: float) -> dist.ProcessGroup:
    """Joined collector ``number``'s group of two: the trainer (rank 0) and it (rank 1)."""
    group = dist.ProcessGroupGloo(
        dist.PrefixStore(f"{number}/group", store), rank, 2, timedelta(seconds=timeout_s)
    )
    # a ProcessGroup's point-to-point calls, which the stubs give the base only
    return cast(dist.ProcessGroup, group)


class JoinDesk:
    """Trainer 0's side: accepts joining collectors and hands over their batches."""

    def __init__(
        self,
        store: dist.Store,
        template: TensorDict,
        timeout_s: float,
        server: dist.Store | None = None,
    ):
        """``server``: the store's own, when ``store`` is a prefix of it (kept as long as the
        desk)."""
        self.store, self.template, self.timeout_s, self.server = store, template, timeout_s, server
        self.seen = 0  # joiners that took a number
        # those that have not said hello yet (they make their envs first)
        self.waiting: list[int] = []
        self.looked_at = -LOOK_S  # when the store was last asked for newcomers
        self.ready: queue.Queue[tuple[threading.Event, TensorDict]] = queue.Queue()
        # the batch handed out last: its thread waits to receive the next
        self.taken: threading.Event | None = None
        self.threads: dict[int, threading.Thread] = {}

    def poll(self) -> TensorDict | None:
        """A joined collector's batch if one is in, valid until the next call; never blocks long."""
        if self.taken is not None:
            # the last one was used: its collector's next batch may land in its buffer
            self.taken.set()
            self.taken = None
        # a round trip to the store: not before every batch
        if time.monotonic() - self.looked_at > LOOK_S:
            self.looked_at = time.monotonic()
            if (count := int(self.store.add(COUNT, 0))) > self.seen:
                self.waiting += range(self.seen + 1, count + 1)
                self.seen = count
            for number in [n for n in self.waiting if self.store.check([hello_key(n)])]:
                self.waiting.remove(number)
                self._accept(number)
        try:
            self.taken, batch = self.ready.get_nowait()
        except queue.Empty:
            return None
        return batch

    def _accept(self, number: int) -> None:
        hello = json.loads(self.store.get(hello_key(number)))
        who = f"collector {number} of another launch ({hello['host']}, pid {hello['pid']})"
        if hello["schema"] != schema(self.template):
            self.store.set(
                answer_key(number),
                "its batches' layout differs from this job's: launch it from the same harness",
            )
            log.warning("%s refused: its batches' layout differs", who)
            return
        self.store.set(answer_key(number), "ok")
        thread = threading.Thread(
            target=self._receive, args=(number, who), name=f"joined-{number}", daemon=True
        )
        self.threads[number] = thread
        thread.start()

    def _receive(self, number: int, who: str) -> None:
        """One joined collector's batches into one buffer, each handed over and used before the next
        lands."""
        try:
            group = pair_group(self.store, number, 0, self.timeout_s)
            batch = pack(self.template.clone())
            wire = buffer_of(batch)
            log.info("%s joined", who)
            while True:
                group.recv([wire], 1, 0).wait(timedelta(seconds=self.timeout_s))
                if float(batch["stats", "last"]):
                    log.info("%s left", who)
                    return
                used = threading.Event()
                self.ready.put((used, batch))
                used.wait()
        # it died, or fell silent for the timeout: it costs its own frames only
        except RuntimeError as e:
            log.warning("%s dropped: %s", who, str(e).splitlines()[0])

    def close(self) -> None:
        """After the stop: every joined collector's last batches taken and discarded (bounded)."""
        if self.taken is not None:
            self.taken.set()
        for thread in self.threads.values():
            while thread.is_alive():
                try:
                    used, _ = self.ready.get(timeout=0.1)
                    used.set()
                except queue.Empty:
                    thread.join(0.1)


class JoinedSender:
    """A joined collector's end: its batches to trainer 0 over their group of two."""

    def __init__(self, group: dist.ProcessGroup, timeout_s: float):
        self.group, self.timeout_s = group, timeout_s

    def send(self, batch: TensorDict, while_waiting: Callable[[], object] | None = None) -> None:
        """Returns once the trainer took ``batch``; ``while_waiting`` is called meanwhile (async
        mode: the weights)."""
        batch["stats", "joined"].fill_(1)
        # its SIGTERM means: this collector leaves, not: the job stops
        batch["stats", "preempt"].zero_()
        send_while(lambda: self._send(batch), while_waiting)

    def _send(self, batch: TensorDict) -> None:
        try:
            self.group.send([buffer_of(batch)], 0, 0).wait(timedelta(seconds=self.timeout_s))
        except RuntimeError as e:
            raise ChannelError(
                f"the job's trainer did not take a batch: {str(e).splitlines()[0]}"
            ) from e

    def send_last(self, batch: TensorDict) -> None:
        batch["stats"].zero_()
        batch["stats", "last"].fill_(1)
        self._send(batch)
