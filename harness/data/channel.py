"""The data channel: collectors' batches to their trainer.

Each batch is one packed buffer (see :mod:`harness.packing`) sent point to
point on a Gloo group that only this channel uses. The trainer receives into
one preallocated buffer per collector, so nothing is pickled or allocated per
batch, and a dead or stalled collector is named within the timeout.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch.distributed as dist
from tensordict import TensorDict

from harness.distributed.handshake import check_schema
from harness.packing import buffer_of, pack, schema


class ChannelError(RuntimeError):
    """A batch did not arrive or could not be sent in time."""


class BatchSender:
    """A collector's end: sends each batch to its trainer."""

    def __init__(self, group: dist.ProcessGroup, rank: int, trainer: int, template: TensorDict, timeout_s: float):
        self.group, self.rank, self.trainer, self.timeout_s = group, rank, trainer, timeout_s
        check_schema(schema(template), group=group, root=0, who=f"rank {rank} (collector)", what="batch")

    def send(self, batch: TensorDict) -> None:
        try:
            dist.isend(buffer_of(batch), dst=self.trainer, group=self.group).wait(timedelta(seconds=self.timeout_s))
        except RuntimeError as e:
            raise ChannelError(
                f"rank {self.rank} (collector) could not hand a batch to trainer rank {self.trainer} "
                f"within {self.timeout_s:g} s: the trainer is gone or stalled. Cause: {e}"
            ) from e


class BatchReceiver:
    """A trainer's end: one batch from each of its collectors per ``receive``."""

    def __init__(self, group: dist.ProcessGroup, rank: int, collectors: list[int], template: TensorDict, timeout_s: float):
        self.group, self.rank, self.collectors, self.timeout_s = group, rank, collectors, timeout_s
        check_schema(schema(template), group=group, root=0, who=f"rank {rank} (trainer)", what="batch")
        self.buffers = {c: pack(template.clone()) for c in collectors}

    def receive(self) -> list[TensorDict]:
        """Batches in collector order; valid until the next ``receive``."""
        works = {c: dist.irecv(buffer_of(self.buffers[c]), src=c, group=self.group) for c in self.collectors}
        deadline = time.monotonic() + self.timeout_s
        for c, work in works.items():
            try:
                work.wait(timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            except RuntimeError as e:
                raise ChannelError(
                    f"rank {self.rank} (trainer) got no batch from collector rank {c} within "
                    f"{self.timeout_s:g} s: that collector died or stalled (see its log). Cause: {e}"
                ) from e
        return [self.buffers[c] for c in self.collectors]
