"""Checkpoints: written by trainer 0, read by every trainer on start-up.

``<run_dir>/checkpoints/step-<step>/`` (env frames; offline: gradient steps) holds ``state.pt``
(models and optimisers, unwrapped from DDP; counters; every trainer's RNG state) and ``meta.json``
(what the checkpoint is: algorithm, env, counters). A checkpoint is written under a temporary name
and renamed when complete, so a crash never leaves a half-written ``step-*``; the newest
``checkpoint.keep`` are kept.

Loading uses ``torch.load(weights_only=True)``: a checkpoint holds tensors and
plain values only, and nothing in one can run code. ``meta.json`` records the
SHA-256 of ``state.pt``; a file whose bytes changed is treated as corrupt. A
checkpoint is never written from weights that are not finite.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

log = logging.getLogger(__name__)


@dataclass
class CheckpointConfig:
    """When trainer 0 writes checkpoints, and how many it keeps."""

    # write one each time this many more frames were learned from; 0: only at the end
    every_frames: int = 100_000
    keep: int = 3  # newest checkpoints kept; older ones are deleted
    resume: bool = True  # start from the newest valid checkpoint in run_dir, if there is one
    # a used run_dir: move its files into <run_dir>/previous-<time>/ and start a new run there
    start_over: bool = False
    # off-policy: keep the replay buffer in checkpoints (large: algo.buffer_size transitions)
    replay_buffer: bool = False
    # a new run's starting point: a checkpoint (<run dir>/checkpoints/step-*) or a run directory
    # (its newest intact checkpoint), whose networks' weights this run starts from, with its own
    # settings and counters at 0
    init_from: Optional[str] = None
    # what else init_from brings: normalizer (observation statistics, reward scale: the weights were
    # learned on inputs so scaled), optimizer (Adam's moments; by default a new run's optimiser
    # starts afresh, as torchtitan's)
    init_with: list[str] = field(default_factory=lambda: ["normalizer"])

    def __post_init__(self) -> None:
        if self.every_frames < 0 or self.keep < 1:
            raise ValueError(
                "checkpoint.every_frames must be >= 0 and checkpoint.keep >= 1; got "
                f"{self.every_frames}, {self.keep}"
            )
        unknown = sorted(set(self.init_with) - set(INIT_WITH))
        if unknown:
            raise ValueError(
                f"checkpoint.init_with={list(self.init_with)}: {unknown} unknown; choose "
                f"from {list(INIT_WITH)}"
            )
        if self.init_from is not None and not holds_a_checkpoint(Path(self.init_from)):
            raise ValueError(
                f"checkpoint.init_from={self.init_from}: no checkpoint there. Name a checkpoint "
                "directory (<run dir>/checkpoints/step-*) or a run directory that holds some (its "
                "newest intact one is used)"
            )


# checkpoint.init_with's choices: what may come along with the weights
INIT_WITH = ("normalizer", "optimizer")


def holds_a_checkpoint(path: Path) -> bool:
    """``path`` is a checkpoint (``step-*``: ``meta.json``, ``state.pt``) or a run directory with
    some."""
    return (path / "meta.json").exists() or any(checkpoint_dir(path).glob("step-*"))


class CheckpointMismatchError(ValueError):
    """A checkpoint from another algorithm or env."""


class CheckpointError(RuntimeError):
    """Checkpoints that cannot be written (non-finite weights) or none of which can be read."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def non_finite(state: object, prefix: str = "") -> list[str]:
    """The keys of floating-point tensors in ``state`` (nested dicts and lists)
    that hold a NaN or an infinity."""
    if isinstance(state, torch.Tensor):
        return (
            [prefix] if state.is_floating_point() and not bool(torch.isfinite(state).all()) else []
        )
    items = (
        state.items()
        if isinstance(state, dict)
        else enumerate(state)
        if isinstance(state, (list, tuple))
        else ()
    )
    return [key for k, v in items for key in non_finite(v, f"{prefix}.{k}" if prefix else str(k))]


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def save(run_dir: Path, state: dict, meta: dict, keep: int) -> Path:
    """Write ``step-<meta["step"]>`` atomically, then delete all but the newest ``keep``.

    Refuses weights and optimiser state that are not finite (``state["algo"]``):
    saving them would replace the last good checkpoint with a useless one.
    """
    bad = non_finite(state.get("algo", {}))
    if bad:
        raise CheckpointError(
            f"at step {meta['step']} the training state is not finite "
            f"({', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}): the run diverged, so no "
            f"checkpoint was written. Resume from the last good one in {checkpoint_dir(run_dir)} "
            "with a lower learning rate, or look at the metrics before this step"
        )
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{meta['step']:012d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    # before: a failed write's file may hold its space until torch lets it go
    free = shutil.disk_usage(root).free
    try:
        tmp.mkdir()
        torch.save(state, tmp / "state.pt")
        meta = {**meta, "saved_at": time.time(), "sha256": sha256(tmp / "state.pt")}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        for f in tmp.iterdir():  # durable before it becomes visible
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    # torch.save reports a failed write as a RuntimeError of its stream
    except (OSError, RuntimeError) as e:
        # no partial checkpoint left behind; the earlier ones stay
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(final, state_bytes(state), free, e) from e
    if final.exists():  # the same frame count again (a resumed run's final save)
        shutil.rmtree(final)
    os.rename(tmp, final)
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def state_bytes(state: object) -> int:
    """The bytes of every tensor in ``state``: about what ``torch.save`` writes."""
    if isinstance(state, torch.Tensor):
        return state.untyped_storage().nbytes()
    items = (
        state.values()
        if isinstance(state, dict)
        else state
        if isinstance(state, (list, tuple))
        else ()
    )
    return sum(state_bytes(v) for v in items)


def write_error(final: Path, needed: int, free: int, cause: BaseException) -> CheckpointError:
    """Why ``final`` could not be written, in words: a full disk says so (torch.save's
    own message is ``basic_ios::clear: iostream error``), with what it needed and had."""
    root = final.parent
    kept = ", ".join(p.name for p in sorted(root.glob("step-*"))) or "none yet"
    if getattr(cause, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or needed >= free:
        return CheckpointError(
            f"checkpoint {final} cannot be written: the disk is full (about {needed:,} bytes "
            f"needed, {free:,} bytes free in {root}). The partial file was removed and the run's "
            f"earlier checkpoints are kept ({kept}). Free space there, or keep fewer "
            "(checkpoint.keep), then resume with the same command"
        )
    return CheckpointError(
        f"checkpoint {final} cannot be written ({type(cause).__name__}: {cause}). The partial file "
        f"was removed and the run's earlier checkpoints are kept ({kept}). Fix the cause, then "
        "resume with the same command"
    )


def verified_meta(path: Path) -> dict:
    """A checkpoint's meta, once its ``state.pt`` matches the checksum written with it."""
    meta = json.loads((Path(path) / "meta.json").read_text())
    if meta.get("sha256") != sha256(Path(path) / "state.pt"):
        raise CheckpointError(
            f"{path}/state.pt does not match the checksum in its meta.json: its bytes were damaged"
        )
    return meta


def intact(path: Path) -> bool:
    try:
        verified_meta(path)
        return True
    except (OSError, ValueError, CheckpointError):
        return False


def read(path: Path) -> tuple[dict, dict]:
    """One checkpoint's ``(state, meta)``, on the CPU; raises if it cannot be
    read or its bytes are not the ones written."""
    meta = verified_meta(path)
    return torch.load(Path(path) / "state.pt", weights_only=True, map_location="cpu"), meta


def newest_readable(run_dir: Path, fix: str) -> tuple[dict, dict, Path] | None:
    """The newest checkpoint of ``run_dir`` that can be read, as ``(state, meta, path)``; None when
    it has none.

    A truncated or corrupt checkpoint is skipped with a warning that names it
    (the one before it is used); when none can be read, that is an error
    listing them, ending with ``fix``, not a fresh start.
    """
    paths = sorted(checkpoint_dir(run_dir).glob("step-*"), reverse=True)
    for path in paths:
        try:
            state, meta = read(path)
        except Exception as e:  # any unreadable checkpoint is skipped, not fatal
            log.warning(
                "skipping checkpoint %s: it cannot be read (%s: %s)", path, type(e).__name__, e
            )
            continue
        return state, meta, path
    if paths:
        raise CheckpointError(
            f"none of the checkpoints in {checkpoint_dir(run_dir)} can be read "
            f"({', '.join(p.name for p in paths)}; the warnings above say why). {fix}"
        )
    return None


def load_latest(run_dir: Path, algo: str, env_id: str) -> tuple[dict, dict, Path] | None:
    """The run's newest valid checkpoint as ``(state, meta, path)``, or None
    (:func:`newest_readable`); one from another algorithm or env is refused."""
    fix = (
        "Nothing was changed: use another run_dir= to start a new run, or "
        "checkpoint.start_over=true to move this run's files aside and start "
        "over in the same directory"
    )
    found = newest_readable(run_dir, fix)
    if found is not None and (found[1].get("algo"), found[1].get("env")) != (algo, env_id):
        meta, path = found[1], found[2]
        raise CheckpointMismatchError(
            f"checkpoint {path} is from algo={meta.get('algo')} env={meta.get('env')}, but this "
            f"run is algo={algo} env={env_id}. Use another run_dir=, or "
            "checkpoint.resume=false to ignore it."
        )
    return found


def load_init(init_from: str) -> tuple[dict, dict, Path]:
    """``checkpoint.init_from``'s checkpoint as ``(state, meta, path)``: the one it names, or the
    newest intact one of the run directory it names; read and checked as a resume's are."""
    where = Path(init_from)
    if (where / "meta.json").exists():
        try:
            state, meta = read(where)
        except Exception as e:  # unreadable: said, with the way out
            raise CheckpointError(
                f"checkpoint.init_from={init_from} cannot be read ({type(e).__name__}: {e}). Name "
                f"another of {where.parent}, or the run directory for its newest intact one"
            ) from e
        return state, meta, where.resolve()
    found = newest_readable(
        where, f"checkpoint.init_from={init_from}: name another run or checkpoint"
    )
    if found is None:
        raise CheckpointError(
            f"checkpoint.init_from={init_from}: {checkpoint_dir(where)} holds no checkpoint"
        )
    return found[0], found[1], found[2].resolve()
