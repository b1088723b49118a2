"""``sync=gloo``: one collective broadcast of the packed payload per publish,
on a Gloo group of trainer 0 and the collectors that nothing else uses.

The subscriber keeps a receive posted into a staging buffer at all times, so
the broadcast lands while the collector steps its envs; ``poll`` applies a
completed one with one copy into the live buffer that the policy views.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Mapping, Sequence

import torch.distributed as dist
from torch import nn

from harness.distributed.handshake import check_schema
from harness.sync.contract import (
    Endpoint,
    Header,
    Payload,
    SyncError,
    WeightPublisher,
    WeightSubscriber,
    weights_of,
)


class GlooPublisher(WeightPublisher):
    def __init__(self, endpoint: Endpoint, timeout_s: float, group: dist.ProcessGroup):
        super().__init__(endpoint, timeout_s)
        self.group = group
        self._work = None

    def connect(self, models: Mapping[str, nn.Module], value_names: Sequence[str] = ()) -> None:
        self.source = weights_of(models)
        self.payload = Payload(models, value_names)
        check_schema(self.payload.schema, group=self.group, root=self.endpoint.rank, who=str(self.endpoint), what="weights")

    def publish(self, header: Header) -> None:
        self._finish()  # the previous broadcast still reads the buffer
        self.payload.write(self.source, header)
        self._work = dist.broadcast(self.payload.buffer, src=self.endpoint.rank, group=self.group, async_op=True)

    def _finish(self) -> None:
        if self._work is None:
            return
        work, self._work = self._work, None
        try:
            work.wait(timedelta(seconds=self.timeout_s))
        except RuntimeError as e:
            subscribers = [r for r in dist.get_process_group_ranks(self.group) if r != self.endpoint.rank]
            raise SyncError(
                f"{self.endpoint} could not deliver weights to collectors {subscribers} within "
                f"{self.timeout_s:g} s: one of them is gone or stalled. Cause: {e}"
            ) from e

    def close(self) -> None:
        self._finish()


class GlooSubscriber(WeightSubscriber):
    def __init__(self, endpoint: Endpoint, timeout_s: float, group: dist.ProcessGroup, publisher_rank: int = 0):
        super().__init__(endpoint, timeout_s)
        self.group = group
        self.publisher_rank = publisher_rank
        self._work = None

    def connect(self, models: Mapping[str, nn.Module], value_names: Sequence[str] = ()) -> None:
        self.live = Payload(models, value_names)
        check_schema(self.live.schema, group=self.group, root=self.publisher_rank, who=str(self.endpoint), what="weights")
        self.live.bind(models)
        self.staging = Payload(models, value_names)
        self._post_receive()

    def _post_receive(self) -> None:
        self._work = dist.broadcast(self.staging.buffer, src=self.publisher_rank, group=self.group, async_op=True)

    def _apply(self) -> Header:
        header = self.staging.header()
        assert header.version >= self.version, "a broadcast arrived out of order"
        self.live.buffer.copy_(self.staging.buffer)
        self.version, self.header = header.version, header
        if header.stop:
            self._work = None  # the publisher sends nothing after a stop
        else:
            self._post_receive()
        return header

    def _complete(self, timeout_s: float, what: str) -> Header:
        try:
            self._work.wait(timedelta(seconds=timeout_s))
        except RuntimeError as e:
            self._work = None
            raise self.timeout_error(what, timeout_s, e) from e
        return self._apply()

    def poll(self) -> Header | None:
        newest = None
        while self._work is not None and self._work.is_completed():
            newest = self._complete(self.timeout_s, "a completed broadcast")
        return newest

    def wait(self, min_version: int, timeout_s: float | None = None) -> Header:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        self.poll()
        while self.version < min_version:
            if self._work is None:
                raise SyncError(
                    f"{self.endpoint} waits for version {min_version} but the publisher "
                    f"stopped at version {self.version}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self.timeout_error(f"weights version >= {min_version}", timeout_s)
            self._complete(remaining, f"weights version >= {min_version}")
        return self.header

    def close(self) -> None:
        self._work = None
