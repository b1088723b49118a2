"""Evaluate a trained run: ``harness evaluate RUN_DIR [key=value ...]``.

    harness evaluate runs/cartpole                # the newest valid checkpoint
    harness evaluate runs/cartpole episodes=20 video=true
    harness evaluate runs/cartpole step=100352 seed=7

Loads the run's newest valid checkpoint (or the one at ``step``) onto the
CPU, wherever it was trained, runs deterministic-policy episodes and prints
the mean ± standard deviation of their returns (and, on MuJoCo's locomotion
tasks, of the distance each episode moved forward). With the run's own seed (the
default) and episode count, the episodes are those of the run's evaluations
(:func:`harness.collect.evaluate.eval_seed`), so a checkpoint scores what the
run logged for it. ``video=true`` also writes the first episode to
``<run_dir>/videos/evaluate-step-<step>.mp4``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from omegaconf import OmegaConf

from harness.cli.policies import load_policy
from harness.cli.usage import HELP_FLAGS, UsageError, command
from harness.collect.config import EnvpoolConfig
from harness.collect.envpool_envs import EnvpoolEnvs
from harness.collect.evaluate import eval_seed, evaluate, make_eval_envs
from harness.core import checkpoint
from harness.metrics import video

USAGE = "harness evaluate RUN_DIR [episodes=N] [step=S] [seed=K] [video=true]"
OPTIONS = ("episodes", "step", "seed", "video")
HELP = f"""usage: {USAGE}

Play deterministic-policy episodes with a run's checkpoint, on the CPU, and print the mean and
standard deviation of their returns (on MuJoCo's locomotion tasks, also of how far each episode
moved forward).

  RUN_DIR      a run directory (where config.yaml and checkpoints/ are)
  episodes=N   how many episodes (default: the run's eval.episodes)
  step=S       the checkpoint at step S, in frames (offline: gradient steps)
               (default: the newest valid one)
  seed=K       the episodes' seed (default: the run's, which plays the episodes of its evaluations)
  video=true   also write the first episode to RUN_DIR/videos/evaluate-step-<step>.mp4"""


@dataclass
class Options:
    """What to evaluate and how; unset fields take the run's own values."""

    run_dir: Path
    episodes: Optional[int] = None  # default: the run's eval.episodes
    # a checkpoint's step (frames; offline: gradient steps); default: the newest valid one
    step: Optional[int] = None
    seed: Optional[int] = None  # default: the run's seed, hence its evaluations' episodes
    video: bool = False  # write the first episode to <run_dir>/videos/evaluate-step-<step>.mp4


def parse(argv: list[str]) -> Options:
    """``RUN_DIR key=value ...``; an unknown key or a missing run directory is an error that says
    what is wrong."""
    if not argv or "=" in argv[0]:
        raise UsageError(f"give the run directory first: usage: {USAGE}")
    options = Options(Path(argv[0]))
    try:
        given = OmegaConf.from_dotlist(argv[1:])
    except Exception as e:  # a malformed key=value: say which, without a traceback
        raise UsageError(f"cannot read the options {' '.join(argv[1:])} ({e})") from None
    for key, value in given.items():
        name = str(key)
        if name not in OPTIONS:
            raise UsageError(
                f"{name}= is not an option of harness evaluate; it takes {', '.join(OPTIONS)} "
                "(harness evaluate --help)"
            )
        setattr(options, name, _checked(name, value))
    if not (options.run_dir / "config.yaml").exists():
        raise UsageError(f"{options.run_dir} is not a run directory (no config.yaml)")
    return options


def _checked(key: str, value: object) -> object:
    """``video``: true or false; the others: whole numbers (``episodes`` at least 1, ``step`` at
    least 0)."""
    if key == "video":
        if not isinstance(value, bool):
            raise UsageError(f"video={value} is not true or false")
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{key}={value} is not a whole number")
    if (key == "episodes" and value < 1) or (key == "step" and value < 0):
        raise UsageError(f"{key}={value}: {key} must be at least {1 if key == 'episodes' else 0}")
    return value


def checkpoint_at(run_dir: Path, step: int) -> Path:
    path = checkpoint.checkpoint_dir(run_dir) / f"step-{step:012d}"
    if not (path / "state.pt").exists():
        have = sorted(
            int(p.name.split("-")[1]) for p in checkpoint.checkpoint_dir(run_dir).glob("step-*")
        )
        raise UsageError(f"{run_dir} has no checkpoint at step {step}; it has: {have or 'none'}")
    return path


def eval_envs(run_cfg: Any, episodes: int, seed: int, render: bool) -> Any:
    """The run's env made for evaluation: envpool's for an ``env.backend=envpool`` run (raw
    rewards, a game an episode, :mod:`harness.collect.envpool_envs`), else gymnasium's."""
    env = run_cfg.env
    if env.get("backend", "gymnasium") != "envpool":
        return make_eval_envs(env.id, episodes, env.get("max_episode_steps"), render=render)
    if render:
        raise UsageError(
            "video=true: this run played envpool (env.backend=envpool), which draws no pictures"
        )
    options = EnvpoolConfig(**{**OmegaConf.to_container(env.envpool), "batch_size": 0})  # type: ignore[dict-item]
    return EnvpoolEnvs(env.id, episodes, options, torch.get_num_threads(), seed, training=False)


def run(options: Options) -> list[float]:
    """Evaluate as ``options`` say; prints the result and returns every episode's return."""
    run_cfg = OmegaConf.load(options.run_dir / "config.yaml")
    env_id = run_cfg.env.id
    if options.step is None and not any(checkpoint.checkpoint_dir(options.run_dir).glob("step-*")):
        raise SystemExit(
            f"{options.run_dir} has no checkpoint yet: trainer 0 writes one every "
            "checkpoint.every_frames frames, when stopped, and at the end"
        )
    where = (
        options.run_dir if options.step is None else checkpoint_at(options.run_dir, options.step)
    )
    try:
        policy, values, info = load_policy(str(where), env_id)
    # no checkpoint yet, or none readable
    except (OSError, ValueError, checkpoint.CheckpointError) as e:
        raise SystemExit(f"{options.run_dir}: {e}") from None
    episodes = int(run_cfg.eval.episodes) if options.episodes is None else options.episodes
    seed = eval_seed(run_cfg.seed if options.seed is None else options.seed, 0, episodes)
    envs = eval_envs(run_cfg, episodes, seed, options.video)
    frames: Optional[list[np.ndarray]] = [] if options.video else None
    distances: list[float] = []
    try:
        returns = evaluate(policy, envs, seed, values, frames, distances)
        fps = (envs.envs[0].metadata.get("render_fps") or 30) if frames is not None else 30
    finally:
        envs.close()
    name = Path(info["policy"]).name
    print(
        f"{env_id} {name}: return {np.mean(returns):.2f} ± {np.std(returns):.2f} over {episodes} "
        f"deterministic episodes (seed {seed})",
        flush=True,
    )
    if distances:  # MuJoCo's locomotion: how far the episodes moved forward
        print(
            f"forward distance (x) {np.mean(distances):.2f} ± {np.std(distances):.2f}",
            flush=True,
        )
    if frames:
        path = video.write_mp4(options.run_dir / "videos" / f"evaluate-{name}.mp4", frames, fps)
        print(f"video: {path} ({len(frames)} frames)", flush=True)
    return returns


def main(argv: Optional[list[str]] = None) -> int:
    """``harness evaluate``: a mistake raises :class:`UsageError`."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in HELP_FLAGS for a in argv):  # asked for, wherever it stands: not a mistake
        print(HELP, flush=True)
        return 0
    options = parse(argv)
    if options.video:
        try:
            video.check_video_support()
        except ValueError as e:
            raise SystemExit(str(e)) from None
    run(options)
    return 0


if __name__ == "__main__":
    sys.exit(command(main))
