"""What the trainer learns about collection between two log rows.

Both kinds are taken whole at a log row and replaced by a fresh one, so a row
never mixes two intervals: ``stats, trainer.stats = trainer.stats, RolloutStats()``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import astuple, dataclass
from typing import NamedTuple, Optional, cast

import torch
import torch.distributed as dist
from tensordict import TensorDict


def standard_error(count: float, total: float, squares: float) -> float:
    """The standard error of the mean of ``count`` values from their sum and sum of squares: the
    sample standard deviation (n - 1) over sqrt(n); nan for fewer than two values."""
    if count < 2:
        return math.nan
    # clamped: rounding can take the sum of squared deviations of equal values below zero
    variance = max(squares - total * total / count, 0.0) / (count - 1)
    return math.sqrt(variance / count)


@dataclass
class RolloutStats:
    """Collectors' batches since the last row: episodes that ended in them,
    evaluation episodes riding on them, and the policy lag of the frames kept."""

    episodes: float = 0.0
    return_sum: float = 0.0
    length_sum: float = 0.0
    eval_episodes: float = 0.0
    eval_return_sum: float = 0.0
    eval_return_sq_sum: float = 0.0  # their squared returns, for eval/return_sem
    eval_distance_episodes: float = 0.0  # those whose env reports x_position (MuJoCo locomotion)
    eval_distance_sum: float = 0.0  # how far those moved forward, summed
    batches_dropped: float = 0.0  # async mode: batches older than collector.max_policy_lag
    frames_dropped: float = 0.0  # their frames
    # envs that raised and were made again (their broken episode is not counted)
    env_restarts: float = 0.0
    # collectors' worker processes replaced (collector.max_restarts)
    collector_restarts: float = 0.0
    frames_lost: float = 0.0  # frames of the batches those workers left unfinished
    # frames kept from collectors that joined the running job (harness.cli.join)
    joined_frames: float = 0.0
    collect_s: float = 0.0  # collectors' seconds stepping envs for these batches
    # collectors' seconds waiting before them (for a trainer, or a version)
    collector_wait_s: float = 0.0
    trainer_wait_s: float = 0.0  # trainers' seconds waiting for batches
    lag_frames: float = 0.0  # frames whose lag was counted
    lag_sum: float = 0.0
    lag_min: float = math.inf
    lag_max: float = -math.inf

    def add(self, batch: TensorDict, version: int, dropped: bool = False) -> None:
        """Count ``batch`` (acted with ``rollout.policy_version``) as seen by a
        trainer at ``version``; a dropped batch counts its episodes, not its lag."""
        stats = batch["stats"]
        self.episodes += float(stats["episodes"])
        self.return_sum += float(stats["return_sum"])
        self.length_sum += float(stats["length_sum"])
        result = EvalResult.read(-1, stats)
        self.eval_episodes += result.episodes
        self.eval_return_sum += result.return_sum
        self.eval_return_sq_sum += result.return_sq_sum
        self.eval_distance_episodes += result.distance_episodes
        self.eval_distance_sum += result.distance_sum
        self.add_faults(batch)
        self.collect_s += float(stats["collect_s"])
        self.collector_wait_s += float(stats["wait_s"])
        if dropped:
            self.batches_dropped += 1
            self.frames_dropped += batch["rollout"].numel()
            return
        self.joined_frames += float(stats["joined"]) * batch["rollout"].numel()
        lag = version - batch["rollout", "policy_version"]
        self.lag_frames += lag.numel()
        self.lag_sum += float(lag.sum())
        self.lag_min = min(self.lag_min, float(lag.min()))
        self.lag_max = max(self.lag_max, float(lag.max()))

    def add_faults(self, batch: TensorDict) -> None:
        """After the stop: a batch the trainer discards, or a collector's goodbye, counts only the
        faults it reports (envs and workers replaced, frames lost), so that every replacement of
        a run reaches its last row, also one whose batch came too late to be learned from."""
        stats = batch["stats"]
        self.env_restarts += float(stats["env_restarts"])
        self.collector_restarts += float(stats["collector_restarts"])
        self.frames_lost += float(stats["frames_lost"])

    def reduced(self, group: Optional[dist.ProcessGroup]) -> RolloutStats:
        """These statistics summed over the trainers of ``group`` (a collective;
        each trainer's collectors are its own), or as they are with one trainer."""
        if group is None:
            return self
        values = torch.tensor(astuple(self), dtype=torch.float64)
        # lag_min, lag_max come last
        sums, extremes = values[:-2].clone(), torch.stack([-values[-2], values[-1]])
        dist.all_reduce(sums, group=group)
        dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=group)
        return RolloutStats(*[*sums.tolist(), -float(extremes[0]), float(extremes[1])])

    def row(self) -> dict[str, float]:
        def mean(total: float, count: float) -> float:
            return total / count if count else math.nan

        row = {
            "train/episode_return": mean(self.return_sum, self.episodes),
            "train/episode_length": mean(self.length_sum, self.episodes),
            "train/episodes": self.episodes,
            "collect/policy_lag_min": self.lag_min if self.lag_frames else math.nan,
            "collect/policy_lag_mean": mean(self.lag_sum, self.lag_frames),
            "collect/policy_lag_max": self.lag_max if self.lag_frames else math.nan,
            "collect/batches_dropped": self.batches_dropped,
            "collect/frames_dropped_fraction": mean(
                self.frames_dropped, self.frames_dropped + self.lag_frames
            ),
            # wall-clock shares: how much of its time a collector did not step envs
            "collect/idle_fraction": mean(
                self.collector_wait_s, self.collector_wait_s + self.collect_s
            ),
            "collect/env_restarts": self.env_restarts,
            "collect/collector_restarts": self.collector_restarts,
            "collect/frames_lost": self.frames_lost,
            "collect/joined_fraction": mean(self.joined_frames, self.lag_frames),
        }
        if self.eval_episodes:
            row["eval/return"] = self.eval_return_sum / self.eval_episodes
            row["eval/return_sem"] = standard_error(
                self.eval_episodes, self.eval_return_sum, self.eval_return_sq_sum
            )
        if self.eval_distance_episodes:
            row["eval/distance"] = self.eval_distance_sum / self.eval_distance_episodes
        return row


class EvalResult(NamedTuple):
    """One evaluation of one weights version. It travels as a batch's ``stats``
    entries named ``eval_`` and its field's name (``eval_return_sum``, ...)."""

    version: int
    episodes: float
    return_sum: float
    return_sq_sum: float  # the sum of the squared episode returns
    # Where the env reports x_position (MuJoCo's locomotion): how far its episodes moved forward,
    # so that a return earned standing still (Hopper's alive bonus) shows in the run's own metrics.
    distance_episodes: float = 0.0
    distance_sum: float = 0.0

    def stamp(self, stats: TensorDict) -> None:
        """Writes this result into a batch's ``stats``."""
        for name in EVAL_FIELDS:
            stats[f"eval_{name}"].fill_(getattr(self, name))

    @classmethod
    def read(cls, version: int, stats: TensorDict) -> EvalResult:
        """The result a batch's ``stats`` carry (all zero where none rode on it)."""
        return cls(version, *(float(stats[f"eval_{name}"]) for name in EVAL_FIELDS))


EVAL_FIELDS = EvalResult._fields[1:]  # what travels; the version travels as the batch's own


@dataclass
class EvalStats:
    """Evaluations reported since the last row (offline runs)."""

    episodes: float = 0.0
    return_sum: float = 0.0
    return_sq_sum: float = 0.0
    distance_episodes: float = 0.0
    distance_sum: float = 0.0
    version: int = -1  # the newest version evaluated

    def add(self, results: list[EvalResult]) -> None:
        for result in results:
            self.episodes += result.episodes
            self.return_sum += result.return_sum
            self.return_sq_sum += result.return_sq_sum
            self.distance_episodes += result.distance_episodes
            self.distance_sum += result.distance_sum
            self.version = max(self.version, result.version)

    def row(self, normalize: Callable[[float], Optional[float]] | None = None) -> dict[str, float]:
        """``normalize``: return -> normalised score (the dataset's references), if known."""
        if not self.episodes:
            return {}
        ret = self.return_sum / self.episodes
        sem = standard_error(self.episodes, self.return_sum, self.return_sq_sum)
        row = {
            "eval/return": ret,
            "eval/return_sem": sem,
            "eval/episodes": self.episodes,
            "eval/version": self.version,
        }
        if self.distance_episodes:
            row["eval/distance"] = self.distance_sum / self.distance_episodes
        score = normalize(ret) if normalize is not None else None
        if normalize is not None and score is not None:
            row["eval/normalized_score"] = score
            # the normaliser is linear: the same error times its factor
            factor = cast(float, normalize(1.0)) - cast(float, normalize(0.0))
            row["eval/normalized_score_sem"] = sem * abs(factor)
        return row
