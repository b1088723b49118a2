"""What trainer 0 tells the user about a run as a whole: a warning at its
start where the config defeats the algorithm, and a summary at its end.

The summary is one short block, plain text (a log file reads it as a terminal
does), printed once the progress bar is gone, when the run finished or was
stopped (a signal, a collector's preemption): how far it got, in how long, the
latest returns, the run directory, and the commands that come next, ready to
paste: plot it and evaluate its checkpoint (the ``harness`` console script's
verbs), resume it (or train on).
"""

from __future__ import annotations

import logging
import shlex
import shutil
import sys
from pathlib import Path

from harness.algos import Algorithm
from harness.distributed import signals
from harness.metrics.console import Figures, clock
from harness.metrics.logger import MetricsLogger
from harness.sync import WeightPublisher

log = logging.getLogger("harness")


def stop_reason() -> str:
    """Why a run that did not finish stopped."""
    return "interrupted (Ctrl-C)" if signals.interrupted() else "preempted"


def resume_hint(run_dir: Path, run_name: str | None) -> str:
    """How to continue a stopped run: every launch of the same command with its run directory
    resumes from the newest checkpoint there; ``run_name=`` names it already, a default name is the
    launch's time."""
    return (
        "the same command"
        if run_name
        else f"the same command with run_dir={shlex.quote(str(run_dir))}"
    )


def warn_frozen_weights(algo: Algorithm, publisher: WeightPublisher | None) -> None:
    """Trainer 0, at start-up: an on-policy algorithm whose collectors never
    get new weights (``sync=none``) learns from frames its weights did not choose."""
    if publisher is not None and not publisher.delivers_weights and algo.on_policy:
        log.warning(
            "sync=none: the collectors keep the weights they start with, but algo=%s learns "
            "on-policy: after its first update it learns from frames an older policy chose (the "
            "progress line's 'gap' counts the versions the collectors missed). Use sync=gloo or "
            "sync=shm to train; sync=none is for fixed-policy tests",
            algo.cfg.name,
        )


def version_gap(
    publisher: WeightPublisher | None, version: int, first_version: int
) -> dict[str, float]:
    """Trainer 0's row: with ``sync=none``, ``sync/version_gap``, the versions the
    collectors never got (they act with what they had when ``first_version`` went
    out; their policy lag, counted against the headers they do get, stays 0); else nothing."""
    if publisher is None or publisher.delivers_weights:
        return {}
    return {"sync/version_gap": version - first_version}


def as_typed(name: str, path: Path) -> str:
    """``name`` where the command a shell finds by that name is ``path``, else ``path``."""
    found = shutil.which(name)
    return name if found and Path(found).absolute() == path.absolute() else str(path)


def harness_command() -> str:
    """``harness`` where that is the console script beside this interpreter (the one that runs
    with the harness's packages), else that script's path."""
    return as_typed("harness", Path(sys.executable).parent / "harness")


def returns_text(figures: Figures) -> str | None:
    """``train 55.2 | eval 500.0 (final weights)``: the latest of each that there was."""
    values, parts = figures.values, []
    if "train/episode_return" in values:
        parts.append(f"train {values['train/episode_return']:.1f}")
    if "eval/return" in values:
        which = "final weights" if figures.eval_final else "latest evaluation"
        parts.append(f"eval {values['eval/return']:.1f} ({which})")
    return " | ".join(parts) or None


def summary(
    logger: MetricsLogger,
    run_dir: Path,
    run_name: str | None,
    step: int,
    total: int,
    finished: bool,
    budget: str,
) -> str:
    """The block that ends a run at ``step`` of ``total``; ``budget``: the setting that set
    ``total`` (``collector.total_frames``), for training on."""
    unit = logger.step.replace("_", " ")
    ended = "run finished" if finished else f"run stopped ({stop_reason()})"
    # The run's clock (metrics.csv's time_s): a resumed run's earlier launches count.
    seconds = logger.seconds()
    took = f"{seconds:.1f} s" if seconds < 60 else clock(seconds)
    lines = [f"{ended}: {unit} {step:,} of {total:,}, trained for {took}"]
    if returns := returns_text(logger.figures):
        lines.append(f"  return:   {returns}")
    where = shlex.quote(str(run_dir))
    lines.append(f"  run_dir:  {where}")
    harness = shlex.quote(harness_command())
    curves = shlex.quote(str(run_dir / "curves.png"))
    lines.append(f"  plot:     {harness} plot {where} --out {curves}")
    lines.append(f"  evaluate: {harness} evaluate {where}")
    if finished:
        lines.append(f"  train on: {resume_hint(run_dir, run_name)} {budget}={2 * total}")
    else:
        lines.append(f"  resume:   {resume_hint(run_dir, run_name)}")
    return "\n".join(lines)
