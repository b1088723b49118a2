"""What a trainer publishes: its algorithm's weights, as numbered versions.

Every trainer counts versions alike (with several, all learn the same updates); only trainer 0
holds a publisher and sends them. The version is :meth:`Publication.publish`'s alone to advance.
"""

from __future__ import annotations

import time
from typing import Optional, Protocol

import torch

from harness.algos import Algorithm
from harness.roles import report
from harness.rundir.state import Progress
from harness.sync import Header, WeightPublisher


class UpdateWaitError(RuntimeError):
    """A trainer's update still running on its GPU past the bound a publish waits for it."""


class Event(Protocol):
    def query(self) -> bool: ...


def wait_for(event: Event, wait_s: float, what: str) -> None:
    """Until ``event`` has happened, at most ``wait_s`` seconds; then :class:`UpdateWaitError`
    naming ``what``. Polled, sleeping at most a millisecond between looks (a publish waits for
    the update's last kernels, usually microseconds away)."""
    deadline = time.monotonic() + wait_s
    pause = 1e-5
    while not event.query():
        if time.monotonic() > deadline:
            raise UpdateWaitError(
                f"{what} had not finished after {wait_s:g} s (sync.timeout_s): a kernel that "
                "does not end, or a GPU shared with other work; nvidia-smi shows what runs on it"
            )
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)


def wait_for_update(device: torch.device, wait_s: float) -> None:
    """The work queued so far on ``device``'s current stream (the update's own), bounded: an event
    recorded there, not a device-wide ``torch.cuda.synchronize``, which would wait without bound
    and for NCCL's work in flight on its own streams too."""
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    wait_for(event, wait_s, f"trainer 0's update on {device}")


class Publication:
    """``algo``'s weights as versions: trainer 0's ``publisher`` (None on other trainers), the
    newest version sent, the one the run started from, and whether the weights learned since the
    last publish. ``progress.version`` is the version the next publish carries. ``wait_s``: the
    longest a publish waits for the update's GPU work (``sync.timeout_s``)."""

    def __init__(
        self,
        publisher: Optional[WeightPublisher],
        progress: Progress,
        algo: Algorithm,
        wait_s: float,
    ):
        self.publisher, self.progress, self.algo = publisher, progress, algo
        self.wait_s = wait_s
        self.published = -1  # the newest version sent
        self.first = progress.version  # the run's first publish sends it
        self.changed = False  # learned since the last publish: the next one is a new version

    def carried(self) -> int:
        """The version the current weights carry: the newest published, or the next if they
        learned since."""
        return self.progress.version + self.changed

    def header(self, stop: bool = False) -> Header:
        """What travels with the current weights: version, frames, the algorithm's values."""
        version, frames = self.progress.version, self.progress.frames
        return Header(version, frames, stop, self.algo.values_for_header(frames))

    def publish(self, stop: bool = False) -> float:
        """Send the current weights as a new version, if they learned since the last publish (a
        run's first publish sends the version it starts from); a stop is always news to every
        scheme (shm included), so it always carries a new version. Returns milliseconds."""
        if self.changed or (stop and self.progress.version == self.published):
            self.progress.version += 1
        self.changed = False
        if self.publisher is None:
            return 0.0
        device = self.algo.device
        # The update's queued kernels end outside the timing: sync/ms is the publish's.
        if device.type == "cuda":
            wait_for_update(device, self.wait_s)
        started = time.perf_counter()
        self.publisher.publish(self.header(stop))
        self.published = self.progress.version
        return 1000 * (time.perf_counter() - started)

    def row(self) -> dict[str, float]:
        """Trainer 0's row: the bytes a publish sends (``sync/bytes``)."""
        if self.publisher is None:
            return {}
        return {"sync/bytes": self.publisher.payload_bytes}

    def gap(self) -> dict[str, float]:
        """With ``sync=none``, the versions the collectors never got (``report.version_gap``)."""
        return report.version_gap(self.publisher, self.progress.version, self.first)

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()
