"""Trainer 0's progress on the console.

On a terminal, a bar redrawn in place (rich): steps (env frames, or gradient
steps offline) of the total, steps per second, time left, and the latest
training return, evaluation return and policy lag. It moves with every update
(:meth:`ProgressBar.tick`); the figures change with every log row. Anywhere
else (SLURM logs, CI, a pipe) one plain line per log row, with the same figures
and no control characters.
"""

from __future__ import annotations

import io
import logging
import math
import os
import sys
import time
from typing import IO, Any, Optional, Union

from rich.ansi import AnsiDecoder
from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeRemainingColumn
from rich.text import Text


class Figures:
    """The latest figures of a run, kept across rows: an evaluation return
    stays shown until the next evaluation. The final weights' evaluation
    (``eval/final_return``, the last row's) is the latest one. With
    ``sync=none`` the version gap (``sync/version_gap``: the versions the
    collectors never got) stands where the policy lag, always 0 there, would."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.eval_final = False  # the evaluation return shown is the final weights'

    def update(self, row: dict[str, float]) -> None:
        for key in (
            "train/episode_return",
            "eval/return",
            "eval/final_return",
            "collect/policy_lag_mean",
            "sync/version_gap",
        ):
            value = row.get(key)
            if value is not None and not math.isnan(value):
                self.values["eval/return" if key == "eval/final_return" else key] = value
                if key.startswith("eval/"):
                    self.eval_final = key == "eval/final_return"

    def text(self) -> str:
        """``return 23.5 | eval 480.0 | lag 0.00`` (``sync=none``: ``gap 16``), each part once it is
        known."""
        parts = []
        frozen = "sync/version_gap" in self.values
        lag = (
            ("sync/version_gap", "gap", ".0f")
            if frozen
            else ("collect/policy_lag_mean", "lag", ".2f")
        )
        for key, label, fmt in (
            ("train/episode_return", "return", ".1f"),
            ("eval/return", "eval", ".1f"),
            lag,
        ):
            if key in self.values:
                parts.append(f"{label} {self.values[key]:{fmt}}")
        return " | ".join(parts)


def clock(seconds: float) -> str:
    """``HH:MM:SS``; hours go past 24 (a long run's ETA), ``--:--:--`` when unknown."""
    if not math.isfinite(seconds):
        return "--:--:--"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"


class ProgressLines:
    """One line per log row. ``start``: ``(step, time_s)`` where the run
    stands (a resumed run's last kept row), from which the first rate counts."""

    def __init__(
        self,
        total: int,
        step: str = "frames",
        start: tuple[int, float] = (0, 0.0),
        stream: Optional[IO[str]] = None,
    ):
        self.total, self.step, self.stream = total, step, stream or sys.stdout
        self.previous = start
        self.figures = Figures()

    def tick(self, step: int) -> None:
        """Between rows: nothing to show."""

    def write(self, row: dict[str, float]) -> None:
        step, elapsed = int(row[self.step]), row["time_s"]
        steps, seconds = step - self.previous[0], elapsed - self.previous[1]
        rate = steps / seconds if seconds > 0 else 0.0
        self.previous = (step, elapsed)
        self.figures.update(row)
        eta = max(self.total - step, 0) / rate if rate > 0 else math.inf
        unit = self.step.replace("_", " ")
        progress = f"{step:>11,}/{self.total:,} ({100 * step / self.total:5.1f}%)"
        line = f"{unit} {progress} | {rate:8,.0f} {unit}/s | eta {clock(eta)}"
        figures = self.figures.text()
        print(f"{line} | {figures}" if figures else line, file=self.stream, flush=True)

    def close(self) -> None:
        pass


class _Rate(ProgressColumn):
    """Steps per second over the last half minute (rich's estimate)."""

    def render(self, task: Task) -> Text:
        return Text(f"{task.speed:,.0f}/s" if task.speed else "-/s", style="progress.data.speed")


class _Above(io.TextIOBase):
    """Stands in for ``sys.stdout`` or ``sys.stderr`` while the bar is shown:
    each whole line printed goes above the bar, as it was written. Not wrapped
    at the terminal's width (rich's own stand-in breaks a long line in two, a
    run directory's path in the middle): the terminal folds it on screen and
    it stays one line to copy."""

    def __init__(self, console: Console, file: IO[str]):
        self.console, self.file, self.partial, self.decoder = console, file, "", AnsiDecoder()

    def __getattr__(self, name: str) -> object:
        return getattr(self.file, name)

    def write(self, text: str) -> int:
        *lines, self.partial = (self.partial + text).split("\n")
        if lines:
            self._print(lines)
        return len(text)

    def _print(self, lines: list[str]) -> None:
        with self.console:
            self.console.print(
                Text("\n").join(self.decoder.decode_line(line) for line in lines), soft_wrap=True
            )

    def flush(self) -> None:
        if self.partial:
            self._print([self.partial])
            self.partial = ""

    def fileno(self) -> int:
        return self.file.fileno()

    def isatty(self) -> bool:
        return self.file.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]  # io.TextIOBase's would say None
        return getattr(self.file, "encoding", None) or "utf-8"


class ProgressBar:
    """A bar redrawn in place. Lines printed while it is shown (trainer 0's
    own ``logging`` output) go above it, whole, instead of through it.

    Drawn only from the thread that ticks it, at most 4 times a second: rich's
    own refresh thread renders under one lock and writes under another, so on
    a loaded machine an older bar could land after a newer one."""

    REDRAW_S = 0.25

    def __init__(
        self,
        total: int,
        step: str = "frames",
        start: tuple[int, float] = (0, 0.0),
        stream: Optional[IO[str]] = None,
    ):
        self.figures = Figures()
        console = Console(file=stream or sys.stdout, force_terminal=True)
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=30),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f}"),
            _Rate(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[figures]}"),
            console=console,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,  # _Above does it, without wrapping lines
        )
        self.task = self.progress.add_task(
            step.replace("_", " "), total=total, completed=start[0], figures=""
        )
        self.drawn = -math.inf
        self.progress.start()
        # From here sys.stdout and sys.stderr print above the bar.
        self.real = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Above(console, sys.stdout), _Above(console, sys.stderr)
        self.swapped = _log_to(sys.stdout, sys.stderr)

    def tick(self, step: int) -> None:
        self.progress.update(self.task, completed=step)
        if time.monotonic() - self.drawn >= self.REDRAW_S:
            self.drawn = time.monotonic()
            self.progress.refresh()

    def write(self, row: dict[str, float]) -> None:
        self.figures.update(row)
        self.progress.update(self.task, figures=self.figures.text())
        self.progress.refresh()

    def close(self) -> None:
        for stand_in in (sys.stdout, sys.stderr):
            if isinstance(stand_in, _Above):
                stand_in.flush()
        sys.stdout, sys.stderr = self.real
        self.progress.stop()
        for handler, stream in self.swapped:
            handler.setStream(stream)


def _log_to(
    stdout: io.TextIOBase, stderr: io.TextIOBase
) -> list[tuple[logging.StreamHandler, Any]]:
    """Point the logging handlers that write to the real stdout/stderr at
    ``stdout``/``stderr`` (the bar's stand-ins); returns what to restore."""
    swapped = []
    for logger in (logging.getLogger(), logging.getLogger("harness")):
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream in (
                sys.__stdout__,
                sys.__stderr__,
            ):
                target = stdout if handler.stream is sys.__stdout__ else stderr
                swapped.append((handler, handler.setStream(target)))
    return [(h, s) for h, s in swapped if s is not None]


def make_console(
    total: int,
    step: str = "frames",
    start: tuple[int, float] = (0, 0.0),
    stream: Optional[IO[str]] = None,
) -> Union[ProgressBar, ProgressLines]:
    """A bar on a terminal (that is not ``TERM=dumb``), else plain lines."""
    stream = stream or sys.stdout
    if stream.isatty() and os.environ.get("TERM") != "dumb":
        return ProgressBar(total, step, start, stream)
    return ProgressLines(total, step, start, stream)
