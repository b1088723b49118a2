"""Weights through a key of a TCP store: the transport of collectors that joined a running job.

Collectors of another launch (:mod:`harness.cli.join`) are in none of the job's
process groups, so no collective can reach them, and none must wait on them.
Trainer 0 writes every publish, header included, as one value of its join
store (:class:`StoreSink`), then the version under a second key; a joined
collector reads the version, and the value when it is newer
(:class:`StoreSource`). A store's ``set`` replaces a value whole, so what a
reader gets is never torn; it applies only newer versions, so never goes
back; every read is bounded by the store's timeout. The trainer never waits
for a reader: a slow or dead one costs it nothing.

Readers look at most every ``poll_interval_s`` (one round trip to the
trainer's node each), not before every env step as shared-memory readers do.
"""

from __future__ import annotations

import time

import torch
from tensordict import TensorDictBase

from harness.sync.contract import Header, PayloadFactory, SyncError
from harness.sync.payload import Payload

WEIGHTS, VERSION = "weights", "version"


class StoreSink:
    """Trainer 0's writer of ``store`` (a :class:`~harness.sync.contract.Sink`)."""

    def __init__(self, store: torch.distributed.Store):
        self.store = store
        self.payload: Payload | None = None

    def open(self, make_payload: PayloadFactory) -> None:
        self.payload = make_payload()

    def write(self, weights: TensorDictBase, header: Header) -> None:
        assert self.payload is not None  # open() made it
        self.payload.write(weights, header)
        self.store.set(WEIGHTS, self.payload.buffer.cpu().numpy().tobytes())  # type: ignore[arg-type]  # bytes are taken as they are
        self.store.set(VERSION, str(header.version))

    def close(self) -> None:
        self.payload = None


class StoreSource:
    """A joined collector's reader of the job's store (a :class:`~harness.sync.contract.Source`)."""

    def __init__(self, store: torch.distributed.Store, poll_interval_s: float):
        self.store, self.poll_interval_s = store, poll_interval_s
        self.version, self.exhausted = -1, False
        self.looked_at = -float("inf")  # when the version was last read

    def open(self, make_payload: PayloadFactory) -> None:
        self.staging = make_payload()

    def poll_into(self, live: Payload) -> Header | None:
        now = time.monotonic()
        if now - self.looked_at < self.poll_interval_s:
            return None
        self.looked_at = now
        try:
            if not self.store.check([VERSION]) or int(self.store.get(VERSION)) <= self.version:
                return None
            value = self.store.get(WEIGHTS)
        # the store's process (trainer 0) is gone, or did not answer in time
        except RuntimeError as e:
            raise SyncError(f"the job's store stopped answering: {e}") from e
        if len(value) != self.staging.buffer.numel():
            raise SyncError(
                f"the job's weights are {len(value)} bytes, this collector's "
                f"{self.staging.buffer.numel()}"
            )
        self.staging.buffer.copy_(torch.frombuffer(bytearray(value), dtype=torch.uint8))
        live.copy_from(self.staging)
        header = self.staging.header()
        self.version, self.exhausted = header.version, header.stop
        return header

    def wait_into(self, live: Payload, timeout_s: float) -> Header:
        deadline = time.monotonic() + timeout_s
        while (header := self.poll_into(live)) is None:
            if time.monotonic() > deadline:
                raise SyncError(f"no new weights in the job's store for {timeout_s:.1f} s")
            time.sleep(self.poll_interval_s)
        return header

    def close(self) -> None:
        pass
