"""A trainer's log rows: when one is due, the rates in it, what it gathers between rows, and
trainer 0's log that writes it."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple, Optional, cast

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from harness.config import Config
from harness.metrics.logger import MetricsLogger
from harness.metrics.stats import EvalStats, RolloutStats

# The rates of collected frames, which only a run that collects has.
FRAME_RATES = ("collect/frames_per_s", "train/idle_fraction")


class RowClock:
    """A row every ``every`` steps (and after the last update: the trainer asks),
    with the frames and updates per second since the previous row."""

    def __init__(self, step: int, every: int, frames: int, updates: int):
        self.every, self.next = every, step + every
        self.since = (time.monotonic(), frames, updates)

    def due(self, step: int) -> bool:
        return step >= self.next

    def rates(
        self,
        step: int,
        frames: int,
        updates: int,
        waited_s: float = 0.0,
        now: Optional[float] = None,
    ) -> dict[str, float]:
        """The rates from the previous row to ``now`` (``time.monotonic()``; the present if not
        given) (:data:`FRAME_RATES`, then updates), with the share of that time a trainer spent
        waiting for batches (``waited_s``); the next row is due ``every`` steps on."""
        now = time.monotonic() if now is None else now
        started, frames_then, updates_then = self.since
        elapsed = now - started
        row = {
            "collect/frames_per_s": (frames - frames_then) / elapsed,
            "train/idle_fraction": waited_s / elapsed,
            "train/updates_per_s": (updates - updates_then) / elapsed,
        }
        self.next, self.since = step + self.every, (now, frames, updates)
        return row


class LastUpdate(NamedTuple):
    """The last update's figures, kept for the last row, which :meth:`Trainer.end` makes once the
    collectors said goodbye (the faults they report with it belong in it)."""

    metrics: Mapping[str, torch.Tensor | float]
    sync_ms: float
    at: float  # when it ended (time.monotonic()): the row's rates end here


class RowBook:
    """What a trainer's next row gathers (the rollouts' statistics and the evaluations since the
    last row), when it is due (``clock``), and trainer 0's ``logger`` (None on other trainers),
    with the rows it keeps for the run's end."""

    def __init__(self, logger: Optional[MetricsLogger], clock: RowClock):
        self.logger, self.clock = logger, clock
        self.stats, self.evals = RolloutStats(), EvalStats()
        self.final: LastUpdate | None = None  # what the last row is made of, at the run's end
        self.last: dict[str, float] = {}  # the newest row written

    def take(self, ddp_group: Optional[dist.ProcessGroup]) -> tuple[RolloutStats, EvalStats]:
        """The statistics since the last row, summed over the trainers (a collective with several),
        and the evaluations; the next row gathers anew."""
        stats, self.stats = self.stats.reduced(ddp_group), RolloutStats()
        evals, self.evals = self.evals, EvalStats()
        return stats, evals

    def tick(self, step: int) -> None:
        """After every update: trainer 0's progress bar moves."""
        if self.logger is not None:
            self.logger.tick(step)

    def write(self, step: int, row: dict[str, float]) -> None:
        """Trainer 0 writes ``row`` at ``step``; other trainers keep nothing."""
        if self.logger is not None:
            self.last = row
            self.logger.log(step, row)

    def close(self) -> None:
        if self.logger is not None:
            self.logger.close()


def open_log(cfg: Config, run_dir: Path, total: int, step: int, unit: str) -> MetricsLogger:
    """Trainer 0's log of a run of ``total`` steps, named ``unit``, that stands at ``step``. It
    holds the config as ``config.yaml`` does, interpolations unresolved: no secret reaches wandb
    either."""
    saved = run_dir / "config.yaml"
    config = (
        cast(dict, OmegaConf.to_container(OmegaConf.load(saved), resolve=False))
        if saved.exists()
        else {}
    )
    return MetricsLogger(run_dir, total, cfg.logger, config, resume_step=step, step=unit)
