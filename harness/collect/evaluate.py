"""Evaluation: deterministic-policy episodes, one per env, with one seed rule.

Four callers share it: the first collector of an online run (every
``eval.every_frames``, results riding on its next batch), every collector of
an offline run (each new version, results sent to the trainer), a
single-process run, which evaluates in the trainer's own process, and
``harness evaluate``, which evaluates a checkpoint. The first
evaluator of a run and ``harness evaluate`` with the run's seed play the same
episodes. With ``eval.video_every``, the first evaluator records env 0's
episode of every so many evaluations to ``<run_dir>/videos/``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Optional, cast

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from harness.algos.base import Policy
from harness.algos.memory import STATE, restarted
from harness.collect.envs import check_env_id, made_for, make_vec_env, to_tensor
from harness.metrics import video
from harness.metrics.stats import EvalResult
from harness.sync.contract import Header

EVAL_SEED_OFFSET = 10_000_000


def eval_seed(seed: int, evaluator: int, episodes: int) -> int:
    """The first seed of the evaluation envs of a run's ``evaluator``-th
    evaluating rank (0: the first collector, or the single process of a
    world-size-1 run). Training envs take ``seed + rank * num_envs`` onwards,
    so evaluation never replays a training episode, and no two evaluators
    play the same episodes."""
    return seed + EVAL_SEED_OFFSET + evaluator * episodes


class VideoSchedule:
    """Which evaluations to record, and where: the 1st, (K+1)th, (2K+1)th ... (``every`` = K)."""

    def __init__(self, directory: Path, every: int, prefix: str = "eval"):
        self.directory, self.every, self.prefix = directory, every, prefix
        self.count = 0

    def due(self) -> bool:
        """Counts one evaluation; whether to record it."""
        self.count += 1
        return (self.count - 1) % self.every == 0

    def save(self, frames: list[np.ndarray], fps: float, name: str) -> Path:
        return video.write_mp4(self.directory / f"{self.prefix}-{name}.mp4", frames, fps)


def video_schedule(run_dir: Optional[str], every: int) -> Optional[VideoSchedule]:
    """``eval.video_every`` = ``every`` as a schedule writing to ``<run_dir>/videos``; None for no
    videos."""
    return VideoSchedule(Path(run_dir) / "videos", every) if every and run_dir else None


def make_eval_envs(
    env_id: str, episodes: int, max_episode_steps: Optional[int], render: bool
) -> gym.vector.SyncVectorEnv:
    """``episodes`` envs; with ``render``, env 0 draws RGB frames (off-screen, no display
    needed)."""
    if not render:
        return make_vec_env(env_id, episodes, max_episode_steps, training=False)
    check_env_id(env_id)
    video.headless_rendering()
    flavour = made_for(env_id, training=False)
    makers = [
        lambda i=i: gym.make(
            env_id,
            max_episode_steps=max_episode_steps,
            render_mode="rgb_array" if i == 0 else None,
            **flavour,
        )
        for i in range(episodes)
    ]
    return gym.vector.SyncVectorEnv(makers, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


@torch.no_grad()
def evaluate(
    policy: Policy,
    envs: gym.vector.SyncVectorEnv,
    seed: int,
    values: dict[str, float],
    frames: Optional[list[np.ndarray]] = None,
    distances: Optional[list[float]] = None,
) -> list[float]:
    """Run one episode in each of ``envs`` (same-step autoreset) and return
    the episode returns. Bounded by the envs' time limits (Atari's: its game's
    108,000 emulator frames, as in training; a game waiting for FIRE after a
    lost life is served by the env, :mod:`harness.collect.pixels`). ``frames``:
    append env 0's picture before each of its steps (one frame per step). A
    policy with memory starts each episode from a zero state and carries it
    from step to step, as collectors do. ``distances``: where the env reports its
    ``x_position`` (MuJoCo's locomotion tasks), append how far each episode moved
    forward (its last ``x_position`` minus its first): a return earned standing
    still shows as about 0."""
    obs, info = envs.reset(seed=seed)
    start = (
        np.asarray(info["x_position"]) if distances is not None and "x_position" in info else None
    )
    moved = np.zeros(envs.num_envs)
    obs = to_tensor(obs)
    state: dict[str, torch.Tensor] = {}  # with memory: {"state": each env's}
    returns = np.zeros(envs.num_envs)
    finished = np.zeros(envs.num_envs, dtype=bool)
    space = envs.single_action_space
    low_high = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None
    while not finished.all():
        if frames is not None and not finished[0]:
            # render_mode rgb_array: one array
            frames.append(cast(np.ndarray, envs.envs[0].render()))
        out = policy.act(obs, values, deterministic=True, **state)
        action = out["action"].numpy()
        if low_high is not None:
            action = np.clip(action, *low_high)
        next_obs, reward, terminated, truncated, info = envs.step(action)
        ended = (terminated | truncated) & ~finished
        if start is not None and ended.any():  # their last x, from final_info
            moved[ended] = info["final_info"]["x_position"][ended] - start[ended]
        if STATE in out:
            state = {"state": restarted(out[STATE], torch.from_numpy(terminated | truncated))}
        returns += np.where(finished, 0.0, reward)
        finished |= terminated | truncated
        obs = to_tensor(next_obs)
    if start is not None:
        cast("list[float]", distances).extend(moved.tolist())
    return returns.tolist()


class Evaluation:
    """``episodes`` envs of ``env_id`` and a policy whose weights someone else
    keeps current (a weight subscriber): each call evaluates them as they are.
    ``videos``: record env 0's episode of the evaluations it says."""

    def __init__(
        self,
        env_id: str,
        max_episode_steps: int | None,
        episodes: int,
        policy: Policy,
        seed: int,
        videos: Optional[VideoSchedule] = None,
        envs: Optional[gym.vector.SyncVectorEnv] = None,
    ):
        """``envs``: made by the caller (envpool's, :mod:`harness.collect.envpool_envs`), else
        ``episodes`` envs of ``env_id``."""
        self.envs = envs or make_eval_envs(
            env_id, episodes, max_episode_steps, render=videos is not None
        )
        self.policy, self.seed, self.videos = policy, seed, videos

    def __call__(self, header: Header) -> EvalResult:
        frames: Optional[list[np.ndarray]] = (
            [] if self.videos is not None and self.videos.due() else None
        )
        distances: list[float] = []
        returns = evaluate(
            self.policy, self.envs, self.seed, dict(header.values), frames, distances
        )
        if self.videos is not None and frames:
            fps = self.envs.envs[0].metadata.get("render_fps") or 30
            self.videos.save(frames, fps, f"{header.frames:012d}-v{header.version:06d}")
        squares = math.fsum(r * r for r in returns)
        return EvalResult(
            header.version,
            float(len(returns)),
            math.fsum(returns),
            squares,
            float(len(distances)),
            math.fsum(distances),
        )

    def close(self) -> None:
        self.envs.close()


class PeriodicEvaluation:
    """An online run's evaluation: each time ``every`` more frames were learned
    from (by the frame count that travels with the weights); the result rides
    on the collector's next batch."""

    def __init__(self, evaluation: Evaluation, every: int):
        self.evaluation, self.every, self.next = evaluation, every, every
        self.result: Optional[EvalResult] = None  # evaluated, not yet on a batch

    def run_if_due(self, header: Header) -> float:
        """Evaluates the weights as they are now if they are due; returns the seconds it took."""
        if header.frames < self.next:
            return 0.0
        started = time.perf_counter()
        self.result = self.evaluation(header)
        self.next = (header.frames // self.every + 1) * self.every
        return time.perf_counter() - started

    def stamp(self, batch: TensorDict) -> None:
        """Puts the result not yet sent on ``batch``."""
        if self.result is not None:
            self.result.stamp(batch["stats"])
            self.result = None

    def maybe_run(self, batch: TensorDict, header: Header) -> None:
        """Evaluates if due, its result on ``batch``."""
        self.run_if_due(header)
        self.stamp(batch)

    def close(self) -> None:
        self.evaluation.close()
