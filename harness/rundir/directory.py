"""A run directory only grows: what a launch may do with one an earlier launch wrote.

- A fresh directory: the run starts.
- A used one (``config.yaml``, ``metrics.csv`` or ``checkpoints/`` in it):
  the same run continues (``checkpoint.resume=true``, the default) only if
  its saved config matches the new one, but for the budget, logging,
  checkpoint and placement settings; ``checkpoint.start_over=true`` first
  moves every file into ``previous-<time>/``; anything else is refused, and a
  refused launch changes nothing. Nothing is ever deleted.
- A restarted attempt of the same launch (torchrun ``--max-restarts``, a
  SLURM requeue) always continues its own run.
- Any other directory (one holding files that no run writes, and no run's
  ``config.yaml``: ``/``, a folder of the user's) is refused, start over or not.
- A resume keeps the layout the run started with (``layout.json``) where it
  decides what an update learns from (:func:`refuse_another_layout`).

``config.yaml`` is written unresolved: an ``${oc.env:...}`` interpolation (a
token, say) is saved as written, never as its value.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, cast

import yaml
from omegaconf import DictConfig, OmegaConf

from harness.algos import ALGOS
from harness.config import Config
from harness.core import checkpoint
from harness.distributed.topology import Layout
from harness.metrics.flat import flat
from harness.rundir.lock import LOCK_NAME
from harness.rundir.state import check_init_from, check_resumes

# Settings a resumed run may change: how long it runs, how it is watched and
# checkpointed, and where it computes. Anything else changes what is learned.
MAY_CHANGE = (
    "collector.total_frames",
    "algo.gradient_steps",
    "logger.",
    "checkpoint.",
    "eval.",
    "run_dir",
    "run_name",
    "runs_root",
    "dist_timeout_s",
    "dist_late_s",  # when a late rank is named in the log
    "sync.timeout_s",
    "sync.late_s",
    "trainer.",
    "collector.threads",
    "collector.device",
    "collector.env_step_timeout_s",  # how a hang is bounded, not what is learned
    "algo.compile",  # how the step runs, not what it computes
)
# ... but where a new run starts: a run directory holds one run, started from one place.
MUST_KEEP = ("checkpoint.init_from", "checkpoint.init_with")
# named before other differences, in this order
FIRST = {"algo.name": "algo", "env.id": "env.id", "seed": "seed"}
WRITTEN_BY_A_RUN = ("config.yaml", "metrics.csv", "checkpoints")
# Every name a run writes in its directory (and starting over, and the write
# probe): a directory holding anything else without a run's config.yaml is
# someone else's, and neither becomes a run directory nor is moved aside.
A_RUNS_OWN = (
    *WRITTEN_BY_A_RUN,
    "videos",
    "tensorboard",
    "wandb",
    "wandb_id",
    "layout.json",
    LOCK_NAME,
)
A_RUNS_OWN_PREFIXES = ("previous-", ".write-test-")


class RunDirError(ValueError):
    """A launch that would mix two runs in one directory, or lose files."""


def restarted() -> bool:
    """This process is a restarted attempt of a launch that already ran here."""
    return (
        int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) > 0
        or int(os.environ.get("SLURM_RESTART_COUNT", 0)) > 0
    )


def schema_defaults(algo: str) -> dict[str, Any]:
    """Every setting's default, flat: what a harness without the setting did."""
    schema = OmegaConf.structured(Config)
    schema.algo = OmegaConf.structured(ALGOS[algo].Config)
    return flat(OmegaConf.to_container(schema, resolve=False))


def differences(saved: dict, new: dict) -> list[str]:
    """``key: old -> new`` for each value that differs, but for the settings a
    resume may change. A setting the saved config lacks (a harness older than
    the setting wrote it) reads as its default, so upgrading the harness does
    not strand a run; one the new config lacks reads as ``<absent>``."""
    old, now = flat(saved), flat(new)
    default = schema_defaults(str(now.get("algo.name", old.get("algo.name"))))
    # What the run is first (another algorithm explains every hyper-parameter that differs), then
    # the rest.
    compared = (
        k for k in set(old) | set(now) if k.startswith(MUST_KEEP) or not k.startswith(MAY_CHANGE)
    )
    keys = sorted(compared, key=lambda k: (k not in FIRST, k))

    def before(k: str) -> Any:
        return old.get(k, default.get(k, "<absent>"))

    return [
        f"{FIRST.get(k, k)}: {before(k)} -> {now.get(k, '<absent>')}"
        for k in keys
        if before(k) != now.get(k, "<absent>")
    ]


def used_by_an_earlier_run(run_dir: Path) -> list[str]:
    return [name for name in WRITTEN_BY_A_RUN if (run_dir / name).exists()]


def holds_a_run(run_dir: Path) -> bool:
    """``run_dir/config.yaml`` is a harness run's: a mapping naming one of its algorithms.
    Read with ``yaml.safe_load``, which builds plain values only."""
    try:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    algo = saved.get("algo") if isinstance(saved, dict) else None
    return (
        isinstance(algo, dict) and algo.get("name") in ALGOS and isinstance(saved.get("env"), dict)
    )


def refuse_foreign(run_dir: Path) -> None:
    """Before anything is written: ``run_dir`` must be new, empty, or hold a
    harness run (files the user added to a run's directory go with it). Any
    other directory is refused naming what it holds, with or without
    ``checkpoint.start_over``: a user's files are never moved, nor mixed with a run's."""
    if not run_dir.is_dir() or holds_a_run(run_dir):
        return
    found = sorted(
        p.name + "/" * p.is_dir()
        for p in run_dir.iterdir()
        if p.name == "config.yaml"
        or not (p.name in A_RUNS_OWN or p.name.startswith(A_RUNS_OWN_PREFIXES))
    )
    if found:
        shown = ", ".join(found[:8]) + (f", ... ({len(found)} in all)" if len(found) > 8 else "")
        raise RunDirError(
            f"run_dir {run_dir} is not a run directory: it holds {shown}, and no harness run's "
            "config.yaml. A run directory must be new, empty or an earlier run's "
            "(checkpoint.start_over moves only a run's files aside). Nothing was changed: pick a "
            "new or empty directory with run_dir=PATH"
        )


def move_aside(run_dir: Path) -> Path:
    """Every file of ``run_dir`` (but earlier ``previous-*`` folders and the
    lock this launch holds) into a new ``previous-<time>/``. The lock stays:
    moved, it would leave the name free for a second launch to lock anew."""
    aside = run_dir / f"previous-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    aside.mkdir()
    for path in run_dir.iterdir():
        if path != aside and not path.name.startswith("previous-") and path.name != LOCK_NAME:
            path.rename(aside / path.name)
    return aside


def check(cfg: Config, raw: DictConfig, run_dir: Path, layout: Layout) -> bool:
    """On every rank, before anything is written: may this launch use
    ``run_dir``? Returns whether it resumes an earlier run. Raises
    :class:`RunDirError` naming the fix when it may not; and a
    ``CheckpointMismatchError`` when the checkpoint it starts from (a new run's
    ``checkpoint.init_from``, or the one it resumes) holds other networks."""
    steps = sorted(checkpoint.checkpoint_dir(run_dir).glob("step-*"), reverse=True)
    anew = (cfg.checkpoint.start_over and not restarted()) or not steps
    # The checkpoint the trainer will read, hashed only where a resume reads one.
    newest = (
        next((s for s in steps if checkpoint.intact(s)), None)
        if cfg.checkpoint.resume and not anew
        else None
    )
    resumes = admits(cfg, raw, run_dir, layout, steps, newest)
    if cfg.checkpoint.init_from and anew:
        check_init_from(cfg)
    elif newest is not None:
        check_resumes(cfg, newest)
    return resumes


def admits(
    cfg: Config,
    raw: DictConfig,
    run_dir: Path,
    layout: Layout,
    steps: list[Path],
    newest: Path | None,
) -> bool:
    """:func:`check`'s verdict on the directory itself, whose checkpoints are ``steps``, ``newest``
    the newest intact."""
    used = used_by_an_earlier_run(run_dir)
    if not used or restarted():
        return bool(used)
    if cfg.checkpoint.start_over:
        return False
    if not cfg.checkpoint.resume:
        raise RunDirError(
            f"run_dir {run_dir} holds an earlier run ({', '.join(used)}); checkpoint.resume=false "
            "would mix the two runs in it. Use another run_dir=, or checkpoint.start_over=true to "
            f"move its files into {run_dir}/previous-<time>/ and start over there (nothing is "
            "deleted)"
        )
    if steps and newest is None:
        names = ", ".join(s.name for s in steps)
        raise RunDirError(
            f"none of the checkpoints in {checkpoint.checkpoint_dir(run_dir)} is intact ({names}: "
            "unreadable, or their bytes do not match their checksums). Nothing was changed: use "
            "another run_dir= for a new run, or checkpoint.start_over=true to move this run's "
            "files aside and start over there"
        )
    saved_path = run_dir / "config.yaml"
    if saved_path.exists():
        # config.yaml is a mapping
        saved = cast(dict, OmegaConf.to_container(OmegaConf.load(saved_path), resolve=False))
        changed = differences(saved, cast(dict, OmegaConf.to_container(raw, resolve=False)))
        if changed:
            new_start = any(c.startswith(MUST_KEEP) for c in changed)
            raise RunDirError(
                f"run_dir {run_dir} holds a run with other settings ({'; '.join(changed[:8])}"
                f"{'; ...' if len(changed) > 8 else ''}). Resuming may change only the "
                "budget, logging, checkpoint cadence and placement"
                f"{' (checkpoint.init_from starts a new run)' if new_start else ''}. Use another "
                "run_name= (or run_dir=) for a new run, or checkpoint.start_over=true to move the "
                "old run aside"
            )
    refuse_another_layout(cfg, run_dir, layout)
    return True


LAYOUT_FILE = "layout.json"  # the ranks a run started with: what its updates learn from


def layout_record(layout: Layout) -> dict[str, int]:
    """What a run's updates learn from: the trainers, and each one's collectors (one process
    collects for itself)."""
    collectors = max(layout.world_size - layout.trainers, 1)
    return {
        "world_size": layout.world_size,
        "trainers": layout.trainers,
        "collectors_per_trainer": collectors // layout.trainers,
    }


def counted(n: int, what: str) -> str:
    return f"{n} {what}{'s' * (n != 1)}"


def layout_text(record: dict[str, int], frames_per_batch: int, sync: bool) -> str:
    trainers, collectors = record["trainers"], record["collectors_per_trainer"]
    update = f": {trainers * collectors * frames_per_batch} frames per update" if sync else ""
    ranks = counted(record["world_size"], "rank")
    return (
        f"{ranks} ({counted(trainers, 'trainer')}, {counted(collectors, 'collector')} each{update})"
    )


def refuse_another_layout(cfg: Config, run_dir: Path, layout: Layout) -> None:
    """A resume keeps what an update learns from: the number of trainers (how a batch is split over
    them, whose replay and RNG each continues) and, where an update takes a round (sync mode),
    each one's collectors (a round's frames: PPO's batch). Async collectors stream batches that an
    update takes one at a time, and an offline run's only evaluate, so their number may change. A
    run started before the harness recorded its layout is not checked."""
    try:
        saved = json.loads((run_dir / LAYOUT_FILE).read_text())
    except (OSError, ValueError):
        return
    now = layout_record(layout)
    sync = ALGOS[cfg.algo.name].update_takes_a_round(cfg.collector.mode)
    keys = ("trainers", "collectors_per_trainer") if sync else ("trainers",)
    if all(saved.get(k) == now[k] for k in keys):
        return
    fpb = cfg.collector.frames_per_batch
    raise RunDirError(
        f"run_dir {run_dir} holds a run started with {layout_text(saved, fpb, sync)}; this launch "
        f"has {layout_text(now, fpb, sync)}. Resuming it would change what an update learns from. "
        f"Relaunch with {counted(saved['world_size'], 'rank')} (harness train "
        f"--nproc {saved['world_size']}, or torchrun --nproc_per_node={saved['world_size']} on one "
        "node) and "
        f"topology.trainers={saved['trainers']}; or start a new run from its weights: "
        f"checkpoint.init_from={run_dir} run_name=<new name>"
    )


def prepare(cfg: Config, raw: DictConfig, run_dir: Path, layout: Layout) -> None:
    """Trainer 0, once the checks passed: move an old run aside if asked, then
    save this launch's config (unresolved, so no secret is written out) and,
    for a new run, its layout (a resume keeps the one the run started with)."""
    if cfg.checkpoint.start_over and used_by_an_earlier_run(run_dir) and not restarted():
        aside = move_aside(run_dir)
        print(f"run_dir: the earlier run's files are now in {aside}", flush=True)
    OmegaConf.save(raw, run_dir / "config.yaml", resolve=False)
    if not (run_dir / LAYOUT_FILE).exists():
        (run_dir / LAYOUT_FILE).write_text(json.dumps(layout_record(layout)) + "\n")
