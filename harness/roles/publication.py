"""What a trainer publishes: its algorithm's weights, as numbered versions.

Every trainer counts versions alike (with several, all learn the same updates); only trainer 0
holds a publisher and sends them. The version is :meth:`Publication.publish`'s alone to advance.
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from harness.algos import Algorithm
from harness.roles import report
from harness.rundir.state import Progress
from harness.sync import Header, WeightPublisher


class Publication:
    """``algo``'s weights as versions: trainer 0's ``publisher`` (None on other trainers), the
    newest version sent, the one the run started from, and whether the weights learned since the
    last publish. ``progress.version`` is the version the next publish carries."""

    def __init__(self, publisher: Optional[WeightPublisher], progress: Progress, algo: Algorithm):
        self.publisher, self.progress, self.algo = publisher, progress, algo
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
            torch.cuda.synchronize(device)
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
