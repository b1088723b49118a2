"""The data channel: collectors' batches to their trainer.

Each batch is one packed buffer (see :mod:`harness.core.packing`) sent point to
point on a Gloo group that only this channel uses. The trainer receives into
one preallocated buffer per collector, so nothing is pickled or allocated per
batch. Back-pressure is built in: a collector's send completes only when its
trainer takes the batch, so at most one batch per collector is in flight and
a slow trainer makes collectors wait (up to the timeout) instead of growing
memory. A dead or stalled collector is named within the timeout.

A collector ends with one final message whose ``stats.last`` is 1, so that a
trainer can take every batch still in flight before it shuts down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from functools import partial

import torch
import torch.distributed as dist
from tensordict import TensorDict

from harness.core.packing import buffer_of, pack, schema
from harness.distributed.handshake import check_schema
from harness.distributed.roll_call import ranks_text
from harness.distributed.waits import LateWatch, Wait

log = logging.getLogger("harness")
POLL_S = (0.0005, 0.008)  # the shortest and longest pause between calls of a send's while_waiting


class ChannelError(RuntimeError):
    """A batch did not arrive or could not be sent in time."""


def send_while(send: Callable[[], None], while_waiting: Callable[[], object] | None) -> None:
    """``send()``, calling ``while_waiting`` until it returns (in a helper thread then:
    Gloo's point-to-point work cannot be polled for completion). The calls come every
    0.5 ms while they find news (a truthy result), and back off to every 8 ms while
    they do not: 31 collectors waiting on a busy trainer, each waking 2,000 times a
    second, took most of two cores."""
    if while_waiting is None:
        return send()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            send()
        except BaseException as e:  # handed to the calling thread
            failure.append(e)

    thread = threading.Thread(target=run, name="batch-send", daemon=True)
    thread.start()
    pause = POLL_S[0]
    while thread.is_alive():
        pause = POLL_S[0] if while_waiting() else min(2 * pause, POLL_S[1])
        thread.join(pause)
    if failure:
        raise failure[0]


class BatchSender:
    """A collector's end: sends each batch to its trainer."""

    def __init__(
        self,
        group: dist.ProcessGroup,
        rank: int,
        trainer: int,
        template: TensorDict,
        timeout_s: float,
    ):
        self.group, self.rank, self.trainer, self.timeout_s = group, rank, trainer, timeout_s
        check_schema(
            schema(template), group=group, root=0, who=f"rank {rank} (collector)", what="batch"
        )
        # A collector fills and sends the same packed batch every time: find its buffer once.
        self._batch: TensorDict | None = None
        self._wire: torch.Tensor | None = None

    def send(self, batch: TensorDict, while_waiting: Callable[[], object] | None = None) -> None:
        """Hand ``batch`` to the trainer; returns once it took it.

        ``while_waiting`` is called repeatedly until then (async mode: polling
        for weights, so that a trainer publishing by collective broadcast never
        waits on a collector that waits on it; :func:`send_while`).
        """
        send_while(lambda: self._send(batch), while_waiting)

    def _buffer(self, batch: TensorDict) -> torch.Tensor:
        if batch is not self._batch:
            self._batch, self._wire = batch, buffer_of(batch)
        assert self._wire is not None  # set with _batch
        return self._wire

    def _send(self, batch: TensorDict) -> None:
        wait = Wait(self.timeout_s, "dist_timeout_s")
        try:
            work = dist.isend(self._buffer(batch), dst=self.trainer, group=self.group)
            # None only on a rank outside the group; every rank is in the data channel's
            assert work is not None
            work.wait(timedelta(seconds=self.timeout_s))
        except RuntimeError as e:
            raise ChannelError(
                f"rank {self.rank} (collector) could not hand a batch to trainer rank "
                f"{self.trainer}: {wait.ended(e, 'the trainer')}. See its "
                f"log{wait.advice('it is only stalled')}. Cause: {e}"
            ) from e

    def send_last(self, batch: TensorDict, restarts: float = 0.0, frames_lost: float = 0.0) -> None:
        """The final message: no frames, ``stats.last`` set, and the worker replacements (with the
        frames they lost) that no batch reported yet."""
        stats = batch["stats"]
        stats.zero_()
        stats["last"].fill_(1)
        stats["collector_restarts"].fill_(restarts)
        stats["frames_lost"].fill_(frames_lost)
        self._send(batch)


class BatchReceiver:
    """A trainer's end: batches from its collectors into preallocated buffers."""

    def __init__(
        self,
        group: dist.ProcessGroup,
        rank: int,
        collectors: list[int],
        template: TensorDict,
        timeout_s: float,
        late_s: float = 0.0,
    ):
        self.group, self.rank, self.collectors, self.timeout_s = group, rank, collectors, timeout_s
        # a collector whose batch is this late is named in the log, once, and again when it comes
        # (0: never)
        self.late_s, self.late = late_s, LateWatch(late_s)
        self.named_late: dict[int, float] = {}  # collectors named late: since when they are silent
        check_schema(
            schema(template), group=group, root=0, who=f"rank {rank} (trainer)", what="batch"
        )
        # sync mode: one per collector
        self.buffers = {c: pack(template.clone()) for c in collectors}
        self.any_buffer = pack(template.clone())  # async mode: whoever comes first
        self.wires = {c: buffer_of(b) for c, b in self.buffers.items()}  # their bytes, what arrives
        self.any_wire = buffer_of(self.any_buffer)
        self.finished: set[int] = set()  # collectors whose final message arrived
        self.last_seen = {c: time.monotonic() for c in collectors}
        self.taken, self.taken_at = 0, dict.fromkeys(collectors, 0)  # batches taken: all, at each's

    def _error(self, c: int, cause: object, wait: Wait) -> ChannelError:
        """Collector ``c``'s batch did not come: ``wait`` says for how long, and whether it is
        gone."""
        return ChannelError(
            f"rank {self.rank} (trainer) got no batch from collector rank {c}: "
            f"{wait.ended(cause, 'that collector')}. See its "
            f"log{wait.advice('it is only stalled')}. Cause: {cause}"
        )

    def _seen(self, c: int, batch: TensorDict) -> TensorDict:
        self.last_seen[c] = time.monotonic()
        self.taken += 1
        self.taken_at[c] = self.taken
        if (since := self.named_late.pop(c, None)) is not None:
            log.warning(
                "rank %d (trainer): collector rank %d sent a batch again, %.1f s after its one "
                "before",
                self.rank, c, self.last_seen[c] - since,
            )  # fmt: skip
        if float(batch["stats", "last"]):
            self.finished.add(c)
        return batch

    def _post(self, c: int, wait: Wait) -> dist.Work:
        """The receive of collector ``c``'s next batch. Posting it fails at once,
        rather than at the wait, when that collector's process has already gone."""
        try:
            work = dist.irecv(self.wires[c], src=c, group=self.group)
        except RuntimeError as e:
            raise self._error(c, e, wait) from e
        assert work is not None  # None only on a rank outside the group
        return work

    def receive(self) -> list[TensorDict]:
        """One batch from every collector, in collector order (sync mode);
        valid until the next call."""
        wait = Wait(self.timeout_s, "dist_timeout_s")
        works = {c: self._post(c, wait) for c in self.collectors}
        for c, work in works.items():
            try:
                with self.late.watching(partial(self._name_late, c, "the round waits for it")):
                    work.wait(timedelta(seconds=max(wait.remaining, 0.001)))
            except RuntimeError as e:
                raise self._error(c, e, wait) from e
        return [self._seen(c, self.buffers[c]) for c in self.collectors]

    def receive_any(self, timeout_s: float | None = None) -> TensorDict:
        """The next batch from whichever collector sends first (async mode);
        valid until the next call. Also fails, naming it, when one collector
        has sent nothing for the timeout while others keep sending. ``timeout_s``: a shorter
        wait than the channel's."""
        self._name_silent()
        silent = [
            c
            for c in self.collectors
            if c not in self.finished and time.monotonic() - self.last_seen[c] > self.timeout_s
        ]
        if silent:
            # its last batch
            since = Wait(self.timeout_s, "dist_timeout_s", started=self.last_seen[silent[0]])
            raise self._error(silent[0], "the other collectors kept sending", since)
        limit, name = (self.timeout_s, "dist_timeout_s") if timeout_s is None else (timeout_s, "")
        wait = Wait(limit, name)
        waiting = [c for c in self.collectors if c not in self.finished]
        try:
            work = dist.irecv(self.any_wire, group=self.group)  # from any source
            assert work is not None  # None only on a rank outside the group
            with self.late.watching(partial(self._name_all_late, waiting)):
                work.wait(timedelta(seconds=limit))
        except RuntimeError as e:  # Gloo's error names an address, not a rank: name them all
            raise ChannelError(
                f"rank {self.rank} (trainer) got no batch from any collector (ranks "
                f"{ranks_text(waiting)}): {wait.ended(e, 'one of them')}. See their "
                f"logs{wait.advice('they are only stalled')}. Cause: {e}"
            ) from e
        return self._seen(work._source_rank(), self.any_buffer)

    def _name_late(self, c: int, meanwhile: str) -> None:
        self.named_late[c] = self.last_seen[c]
        log.warning(
            "rank %d (trainer): collector rank %d has sent no batch for %.1f s (stopped or "
            "stalled?); %s, up to dist_timeout_s=%g",
            self.rank, c, time.monotonic() - self.last_seen[c], meanwhile, self.timeout_s,
        )  # fmt: skip

    def _name_all_late(self, waiting: list[int]) -> None:
        """No batch from any collector for ``late_s`` (async): all of them stopped, or cut off
        from the trainer (a link between nodes)."""
        for c in waiting:
            self.named_late.setdefault(c, self.last_seen[c])
        log.warning(
            "rank %d (trainer): no batch from any collector (ranks %s) for %.0f s (stopped, "
            "stalled or cut off?); waiting up to dist_timeout_s=%g",
            self.rank, ranks_text(waiting), self.late_s, self.timeout_s,
        )  # fmt: skip

    def _name_silent(self) -> None:
        """Name each collector that has sent nothing for ``late_s`` while the trainer took two
        batches per collector from the others: silent alone, not with the others after the
        trainer itself was busy (a checkpoint, a publish), when every collector's batch is
        queued and the first taken would make the rest look silent."""
        if not self.late_s:
            return
        now, enough = time.monotonic(), 2 * len(self.collectors)
        for c in self.collectors:
            if (
                c not in self.finished
                and c not in self.named_late
                and now - self.last_seen[c] > self.late_s
                and self.taken - self.taken_at[c] >= enough
            ):
                self._name_late(c, "the trainer goes on with the others")

    def drain(
        self, seen: Callable[[TensorDict], object] = lambda b: None, timeout_s: float | None = None
    ) -> int:
        """Take every batch still in flight until each collector's final
        message arrived, handing each (final messages too) to ``seen``; returns
        how many batches were discarded. ``timeout_s``: the longest to wait for each."""
        discarded = 0
        while len(self.finished) < len(self.collectors):
            batch = self.receive_any(timeout_s)
            seen(batch)
            discarded += not float(batch["stats", "last"])
        return discarded
