"""Trainer 0's metrics: a CSV file in the run directory, the console
progress, and wandb and TensorBoard on request (``logger.backends``).

The CSV is the embedded default and is always written: a header row, then one
row per log step. A key that first appears later (an algorithm diagnostic that
starts after warm-up, say) widens the header; the file is rewritten once. A
write that fails (a full disk) leaves the file as it was, every row whole, and
stops the run saying so (:class:`MetricsWriteError`): a rewrite goes to a new
file that replaces the old one only once written, and an appended row that did
not fit is cut off again.
"""

from __future__ import annotations

import csv
import errno
import io
import os
import shutil
import time
from pathlib import Path

from harness.metrics.console import Figures, make_console


class MetricsWriteError(RuntimeError):
    """``metrics.csv`` could not be written; the file keeps the rows it had."""


class CSVLog:
    """``resume_step``: a resumed run keeps the rows up to its checkpoint and
    drops later ones (they are logged again), so every step range appears once.
    ``step``: the first column (frames; gradient steps in offline runs)."""

    def __init__(self, path: Path, resume_step: int = 0, step: str = "frames"):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.columns: list[str] = []
        self.rows: list[dict] = []
        if resume_step and path.exists():
            with path.open(newline="") as f:
                reader = csv.DictReader(f)
                self.columns = list(reader.fieldnames or [])
                self.rows = [r for r in reader if float(r[step]) <= resume_step]
            self._rewrite()
        elif path.exists():
            path.unlink()  # a fresh run in a used directory starts a fresh log

    def _rewrite(self) -> None:
        """The whole file, replaced at once: until the new one is written, the old one stands."""
        text = io.StringIO()
        writer = csv.DictWriter(text, self.columns)
        writer.writeheader()
        writer.writerows(self.rows)
        fresh = self.path.with_name(f".{self.path.name}.new")
        try:
            fresh.write_text(text.getvalue(), newline="")
            os.replace(fresh, self.path)
        except OSError as e:
            fresh.unlink(missing_ok=True)
            raise self._error(e) from e

    def _append(self, row: dict[str, float]) -> None:
        """One row at the end; a row that does not fit whole is cut off again."""
        text = io.StringIO()
        csv.DictWriter(text, self.columns).writerow(row)
        data = text.getvalue().encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            end = os.fstat(fd).st_size
            try:
                if os.write(fd, data) != len(data):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError as e:
                os.ftruncate(fd, end)
                raise self._error(e) from e
        finally:
            os.close(fd)

    def _error(self, cause: OSError) -> MetricsWriteError:
        where = self.path.parent
        full = cause.errno in (errno.ENOSPC, errno.EDQUOT)
        why = (
            f"the disk is full ({shutil.disk_usage(where).free:,} bytes free in {where})"
            if full
            else f"{type(cause).__name__}: {cause}"
        )
        return MetricsWriteError(
            f"{self.path} cannot be written: {why}. It keeps the rows it had, each whole, and the "
            "run's checkpoints are kept. "
            + ("Free space there" if full else "Fix the cause")
            + ", then resume with the same command"
        )

    def write(self, row: dict[str, float]) -> None:
        self.rows.append(row)
        new = [k for k in row if k not in self.columns]
        try:
            if new or not self.path.exists():
                self.columns += new
                self._rewrite()  # rare: only when the columns change
            else:
                self._append(row)
        except MetricsWriteError:
            self.rows.pop()
            self.columns = [c for c in self.columns if c not in new]
            raise


class VideoFiles:
    """New ``eval-*.mp4`` files in a directory since the last look (evaluation
    videos that a collector wrote), each with the step in its name. Those of
    ``harness evaluate RUN_DIR video=true`` (``evaluate-*.mp4``) are not the run's."""

    PATTERN = "eval-*.mp4"

    def __init__(self, directory: Path):
        self.directory = directory
        # a resumed run's are old news
        self.seen = set(directory.glob(self.PATTERN)) if directory.exists() else set()

    def new(self) -> list[Path]:
        if not self.directory.exists():
            return []
        found = sorted(set(self.directory.glob(self.PATTERN)) - self.seen)
        self.seen.update(found)
        return found


class MetricsLogger:
    """Trainer 0's sinks: the CSV (always), the console progress, and any of
    wandb and TensorBoard (``logger.backends``); new evaluation videos go to
    the sinks that take videos, at the row's step."""

    def __init__(
        self,
        run_dir: Path,
        total: int,
        cfg,
        config: dict | None = None,
        resume_step: int = 0,
        step: str = "frames",
    ):
        self.step = step
        csv_log = CSVLog(run_dir / "metrics.csv", resume_step, step)
        resumed_s = float(csv_log.rows[-1]["time_s"]) if csv_log.rows else 0.0
        # A resumed run's clock continues from its last kept row.
        self.start = time.monotonic() - resumed_s
        self.sinks: list = [csv_log]
        self.console = make_console(total, step, (resume_step, resumed_s)) if cfg.console else None
        self.figures = Figures()  # the latest returns, for the summary at the end (console or not)
        if "tensorboard" in cfg.backends:
            from harness.metrics.tensorboard_sink import TensorBoardSink

            self.sinks.append(TensorBoardSink(run_dir, step, resume_step, config))
        if "wandb" in cfg.backends:
            from harness.metrics.wandb_sink import WandbSink

            self.sinks.append(WandbSink(run_dir, config or {}, cfg, step))
        self.videos = VideoFiles(run_dir / "videos")

    def close(self) -> None:
        if self.console is not None:
            self.console.close()  # first: what the other sinks print goes below the bar
        for sink in self.sinks:
            if hasattr(sink, "close"):
                sink.close()

    def seconds(self) -> float:
        """The run's clock: ``time_s`` of a row written now."""
        return time.monotonic() - self.start

    def tick(self, step: int) -> None:
        """Between rows, after every update: move the progress bar."""
        if self.console is not None:
            self.console.tick(step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {self.step: step, "time_s": round(self.seconds(), 3), **metrics}
        self.figures.update(row)
        for sink in self.sinks:
            sink.write(row)
        if self.console is not None:
            self.console.tick(step)
            self.console.write(row)
        for path in self.videos.new():
            for sink in self.sinks:
                if hasattr(sink, "write_video"):
                    sink.write_video(path, step)
