"""Moving a payload with a collective broadcast (Gloo or NCCL).

The sink is trainer 0's end; a source is a receiver's end, which keeps one
receive posted into a staging payload at all times so that the broadcast
lands while the collector steps its envs. A broadcast completes once every
receiver has posted its receive, which it does when it applied the one
before; so each source marks the version it applied in a roll call
(:mod:`harness.distributed.roll_call`), and a sink whose broadcast timed out
names the receivers that had not applied the previous one.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist
from tensordict import TensorDictBase

from harness.distributed.roll_call import RollCall, ranks_text
from harness.distributed.waits import Wait
from harness.sync.contract import Endpoint, Header, PayloadFactory, SyncError
from harness.sync.payload import Payload

# the roll call of the versions receivers applied (keys: APPLIED/<rank>)
APPLIED = "weights-applied"


class _BroadcastEnd:
    """What both ends hold: who they are, their group, their payload and the
    broadcast in flight on it."""

    def __init__(self, endpoint: Endpoint, group: dist.ProcessGroup, store: dist.Store | None):
        self.endpoint, self.group = endpoint, group
        self.applied = RollCall(store, APPLIED)  # the versions the receivers applied
        self._work: dist.Work | None = None
        self.payload: Payload | None = None

    def open(self, make_payload: PayloadFactory) -> None:
        self.payload = make_payload()


class BroadcastSink(_BroadcastEnd):
    """Trainer 0's end (a :class:`~harness.sync.contract.Sink`): one broadcast
    of the payload per write."""

    def __init__(
        self,
        endpoint: Endpoint,
        group: dist.ProcessGroup,
        timeout_s: float,
        store: dist.Store | None,
    ):
        super().__init__(endpoint, group, store)
        self.timeout_s = timeout_s
        # the newest version sent, and the one receivers had to apply to take it
        self.sent = self.needed = -1

    def write(self, weights: TensorDictBase, header: Header) -> None:
        self.finish()  # the previous broadcast still reads the buffer
        assert self.payload is not None  # open() made it
        self.payload.write(weights, header)
        self._work = dist.broadcast(
            self.payload.buffer, src=self.endpoint.rank, group=self.group, async_op=True
        )
        self.needed, self.sent = self.sent, header.version

    def finish(self) -> None:
        if self._work is None:
            return
        work, self._work = self._work, None
        wait = Wait(self.timeout_s, "sync.timeout_s")
        try:
            work.wait(timedelta(seconds=self.timeout_s))
        except RuntimeError as e:
            receivers = [
                r for r in dist.get_process_group_ranks(self.group) if r != self.endpoint.rank
            ]
            late = self.applied.behind(receivers, self.needed)
            who = (
                f"rank{'s' * (len(late) > 1)} {ranks_text(late)} had not applied version "
                f"{self.needed} (gone or stalled)"
                if late
                else "every one had applied the version before, so one of them died since"
                if late == []
                else "one of them is gone or stalled"
            )
            raise SyncError(
                f"{self.endpoint} could not deliver weights version {self.sent} to ranks "
                f"{ranks_text(receivers)}: {wait.ended(e)}; {who}. Cause: {e}"
            ) from e

    close = finish


class BroadcastSource(_BroadcastEnd):
    """A receiver's end (a :class:`~harness.sync.contract.Source`): the
    broadcast lands in its payload, which is its staging buffer."""

    def __init__(
        self, endpoint: Endpoint, group: dist.ProcessGroup, root: int, store: dist.Store | None
    ):
        super().__init__(endpoint, group, store)
        self.root = root
        self.version = -1  # the newest version applied

    def open(self, make_payload: PayloadFactory) -> None:
        super().open(make_payload)
        self._post()

    def _post(self) -> None:
        assert self.payload is not None  # open() made it
        self._work = dist.broadcast(
            self.payload.buffer, src=self.root, group=self.group, async_op=True
        )
        self.applied.mark(self.endpoint.rank, self.version)  # ready for the one after it

    @property
    def exhausted(self) -> bool:
        """The publisher sent its stop; nothing more will come."""
        return self._work is None

    def _apply(self, live: Payload) -> Header:
        assert self.payload is not None  # open() made it
        header = self.payload.header()
        live.copy_from(self.payload)
        self.version = header.version
        if header.stop:
            self._work = None
        else:
            self._post()
        return header

    def poll_into(self, live: Payload) -> Header | None:
        if self._work is None or not self._work.is_completed():
            return None
        return self.wait_into(live, timeout_s=1.0)

    def wait_into(self, live: Payload, timeout_s: float) -> Header:
        assert self._work is not None  # callers check exhausted (no receive posted) first
        wait = Wait(timeout_s)
        try:
            self._work.wait(timedelta(seconds=timeout_s))
        except RuntimeError as e:
            self._work = None
            raise SyncError(
                f"the broadcast from rank {self.root} ended {wait.seconds:.1f} s in: {e}"
            ) from e
        return self._apply(live)

    def close(self) -> None:
        self._work = None
