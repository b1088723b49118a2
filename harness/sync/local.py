"""The in-process scheme of world size 1, where one rank trains and collects.

The collector still acts with its own copy of the policy, updated through the
same contract, so the single-process debugging run exercises the same code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import nn

from harness.core.packing import first_difference
from harness.distributed.waits import Wait
from harness.sync.contract import Endpoint, Header, SyncError, WeightPublisher, WeightSubscriber
from harness.sync.payload import Payload, weights_of


class _Mailbox:
    payload: Payload | None = None
    version: int = -1


class LocalPublisher(WeightPublisher):
    """Trainer 0's end: a publish overwrites the mailbox's payload."""

    def __init__(self, endpoint: Endpoint, timeout_s: float, mailbox: _Mailbox):
        super().__init__(endpoint, timeout_s)
        self.mailbox = mailbox

    def connect(self, models: Mapping[str, nn.Module], value_names: Sequence[str] = ()) -> None:
        self.source = weights_of(models)
        self.mailbox.payload = Payload.from_models(models, value_names)
        self.payload_bytes = self.mailbox.payload.buffer.numel()

    def publish(self, header: Header) -> None:
        assert self.mailbox.payload is not None  # connect() made it
        self.mailbox.payload.write(self.source, header)
        self.mailbox.version = header.version


class LocalSubscriber(WeightSubscriber):
    """The collector's end: applies the mailbox's payload with one copy."""

    def __init__(self, endpoint: Endpoint, timeout_s: float, mailbox: _Mailbox):
        super().__init__(endpoint, timeout_s)
        self.mailbox = mailbox

    def connect(self, models: Mapping[str, nn.Module], value_names: Sequence[str] = ()) -> None:
        if self.mailbox.payload is None:
            raise SyncError(f"{self.endpoint}: connect the publisher first")
        self.live = Payload.from_models(models, value_names)
        if self.live.schema != self.mailbox.payload.schema:
            raise SyncError(
                f"{self.endpoint}: schema differs: "
                f"{first_difference(self.live.schema, self.mailbox.payload.schema)}"
            )
        self.live.bind(models)

    def poll(self) -> Header | None:
        if self.mailbox.version <= self.version:
            return None
        # a version was published, so the publisher connected
        assert self.mailbox.payload is not None
        self.live.buffer.copy_(self.mailbox.payload.buffer)
        self.header = self.live.header()
        self.version = self.header.version
        return self.header

    def wait(self, min_version: int, timeout_s: float | None = None) -> Header:
        # Nothing else runs in this process, so an update that is not here
        # now never comes: fail at once rather than sleep.
        self.poll()
        if self.version < min_version:
            raise self.wait_error(f"weights version >= {min_version}", Wait(0.0))
        return self.current_header()


def local_pair(timeout_s: float) -> tuple[LocalPublisher, LocalSubscriber]:
    mailbox = _Mailbox()
    return (
        LocalPublisher(Endpoint(0, "trainer", "local"), timeout_s, mailbox),
        LocalSubscriber(Endpoint(0, "collector", "local"), timeout_s, mailbox),
    )
