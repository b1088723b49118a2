"""Trainer 0's metrics: a CSV file in the run directory and a console line.

The CSV is the embedded default and is always written: a header row, then one
row per log step. A key that first appears later (an algorithm diagnostic that
starts after warm-up, say) widens the header; the file is rewritten once.
"""

from __future__ import annotations

import csv
import math
import sys
import time
from pathlib import Path


class CSVLog:
    """``resume_step``: a resumed run keeps the rows up to its checkpoint and
    drops later ones (they are logged again), so every step range appears once.
    ``step``: the first column (frames; gradient steps in offline runs)."""

    def __init__(self, path: Path, resume_step: int = 0, step: str = "frames"):
        self.path = path
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
        with self.path.open("w", newline="") as f:
            writer = csv.DictWriter(f, self.columns)
            writer.writeheader()
            writer.writerows(self.rows)

    def write(self, row: dict[str, float]) -> None:
        self.rows.append(row)
        new = [k for k in row if k not in self.columns]
        if new or not self.path.exists():
            self.columns += new
            self._rewrite()  # rare: only when the columns change
        else:
            with self.path.open("a", newline="") as f:
                csv.DictWriter(f, self.columns).writerow(row)


class ConsoleProgress:
    """One line per log step: frames (or gradient steps) of total, speed, return, ETA."""

    def __init__(self, total_frames: int, stream=sys.stdout, step: str = "frames"):
        self.total, self.stream, self.step = total_frames, stream, step

    def write(self, row: dict[str, float]) -> None:
        frames, elapsed = row[self.step], row["time_s"]
        fps = frames / elapsed if elapsed > 0 else 0.0
        eta = max(self.total - frames, 0) / fps if fps > 0 else math.inf
        ret = row.get("train/episode_return", row.get("eval/return"))
        ret_text = f"{ret:8.1f}" if ret is not None and not math.isnan(ret) else "       -"
        eta_text = time.strftime("%H:%M:%S", time.gmtime(eta)) if math.isfinite(eta) else "--:--:--"
        print(
            f"[{100 * frames / self.total:5.1f}%] {self.step.replace('_', ' ')} {int(frames):>9,}/{self.total:,} | "
            f"{fps:8,.0f} /s | return {ret_text} | eta {eta_text}",
            file=self.stream,
            flush=True,
        )


class MetricsLogger:
    """Trainer 0's sinks: the CSV, the console line, and wandb if asked for."""

    def __init__(self, run_dir: Path, total: int, cfg, config: dict | None = None, resume_step: int = 0, step: str = "frames"):
        self.step = step
        csv_log = CSVLog(run_dir / "metrics.csv", resume_step, step)
        # A resumed run's clock continues from its last kept row.
        self.start = time.monotonic() - (float(csv_log.rows[-1]["time_s"]) if csv_log.rows else 0.0)
        self.sinks = [csv_log] + ([ConsoleProgress(total, step=step)] if cfg.console else [])
        if cfg.backend == "wandb":
            from harness.metrics.wandb_sink import WandbSink

            self.sinks.append(WandbSink(run_dir, config or {}, cfg, step))

    def close(self) -> None:
        for sink in self.sinks:
            if hasattr(sink, "close"):
                sink.close()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {self.step: step, "time_s": round(time.monotonic() - self.start, 3), **metrics}
        for sink in self.sinks:
            sink.write(row)
