"""Checkpoints: written by trainer 0, read by every trainer on start-up.

``<run_dir>/checkpoints/step-<step>/`` (env frames; offline: gradient steps) holds ``state.pt`` (models and
optimisers, unwrapped from DDP; counters; every trainer's RNG state) and
``meta.json`` (what the checkpoint is: algorithm, env, counters). A checkpoint
is written under a temporary name and renamed when complete, so a crash never
leaves a half-written ``step-*``; the newest ``checkpoint.keep`` are kept.

Loading uses ``torch.load(weights_only=True)``: a checkpoint holds tensors and
plain values only, and nothing in one can run code.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)


@dataclass
class CheckpointConfig:
    """When trainer 0 writes checkpoints, and how many it keeps."""

    every_frames: int = 100_000  # write one each time this many more frames were learned from; 0: only at the end
    keep: int = 3  # newest checkpoints kept; older ones are deleted
    resume: bool = True  # start from the newest valid checkpoint in run_dir, if there is one
    replay_buffer: bool = False  # off-policy: keep the replay buffer in checkpoints (large: algo.buffer_size transitions)

    def __post_init__(self) -> None:
        if self.every_frames < 0 or self.keep < 1:
            raise ValueError(f"checkpoint.every_frames must be >= 0 and checkpoint.keep >= 1; got {self.every_frames}, {self.keep}")


class CheckpointMismatchError(ValueError):
    """A checkpoint from another algorithm or env."""


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def save(run_dir: Path, state: dict, meta: dict, keep: int) -> Path:
    """Write ``step-<meta["step"]>`` atomically, then delete all but the newest ``keep``."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{meta['step']:012d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    (tmp / "meta.json").write_text(json.dumps({**meta, "saved_at": time.time()}, indent=1))
    for f in tmp.iterdir():  # durable before it becomes visible
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():  # the same frame count again (a resumed run's final save)
        shutil.rmtree(final)
    os.rename(tmp, final)
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read(path: Path) -> tuple[dict, dict]:
    """One checkpoint's ``(state, meta)``; raises if it cannot be read."""
    meta = json.loads((Path(path) / "meta.json").read_text())
    return torch.load(Path(path) / "state.pt", weights_only=True, map_location="cpu"), meta


def load_latest(run_dir: Path, algo: str, env_id: str) -> tuple[dict, dict, Path] | None:
    """The newest valid checkpoint as ``(state, meta, path)``, or None.

    A truncated or corrupt checkpoint is skipped with a warning that names it
    (the one before it is used); one from another algorithm or env is refused.
    """
    for path in sorted(checkpoint_dir(run_dir).glob("step-*"), reverse=True):
        try:
            state, meta = read(path)
        except Exception as e:  # any unreadable checkpoint is skipped, not fatal
            log.warning("skipping checkpoint %s: it cannot be read (%s: %s)", path, type(e).__name__, e)
            continue
        if (meta.get("algo"), meta.get("env")) != (algo, env_id):
            raise CheckpointMismatchError(
                f"checkpoint {path} is from algo={meta.get('algo')} env={meta.get('env')}, but this run is "
                f"algo={algo} env={env_id}. Use another run_dir=, or checkpoint.resume=false to ignore it."
            )
        return state, meta, path
    return None
