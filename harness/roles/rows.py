"""When a trainer writes a log row, and the rates in it."""

from __future__ import annotations

import time


class RowClock:
    """A row every ``every`` steps (and after the last update: the trainer asks),
    with the frames and updates per second since the previous row."""

    def __init__(self, step: int, every: int, frames: int, updates: int):
        self.every, self.next = every, step + every
        self.since = (time.monotonic(), frames, updates)

    def due(self, step: int) -> bool:
        return step >= self.next

    def rates(
        self, step: int, frames: int, updates: int, offline: bool, waited_s: float = 0.0
    ) -> dict[str, float]:
        """The rates since the previous row (offline runs collect no frames), and the share of that
        time a trainer spent waiting for batches (``waited_s``); the next row is due ``every`` steps
        on."""
        now = time.monotonic()
        started, frames_then, updates_then = self.since
        elapsed = now - started
        row = (
            {}
            if offline
            else {
                "collect/frames_per_s": (frames - frames_then) / elapsed,
                "train/idle_fraction": waited_s / elapsed,
            }
        )
        row["train/updates_per_s"] = (updates - updates_then) / elapsed
        self.next, self.since = step + self.every, (now, frames, updates)
        return row
