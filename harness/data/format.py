"""What an offline dataset is, whoever reads it: its fields, its meta, its error.

:mod:`harness.data.dataset` (the harness's own directories) and
:mod:`harness.data.minari` (Minari's) both produce these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
FORMAT = 1


def episode_fields(returns: Sequence[float]) -> dict:
    """``Meta``'s ``episodes``, ``behaviour_return`` and ``return_range`` from the returns of the
    episodes that ended inside a dataset (as CORL's ``return_reward_range``, the episode each env is
    in when the data stops is not among them)."""
    if len(returns) == 0:
        return {"episodes": 0, "behaviour_return": float("nan"), "return_range": None}
    values = np.asarray(returns, dtype=np.float64)
    return {
        "episodes": len(values),
        "behaviour_return": float(values.mean()),
        "return_range": [float(values.min()), float(values.max())],
    }


class DatasetError(ValueError):
    """A dataset that is missing, unfinished, or for another env."""


@dataclass
class Meta:
    """What ``meta.json`` says about a dataset."""

    env: str  # gymnasium id the transitions come from
    transitions: int
    episodes: int  # episodes that ended inside the dataset
    behaviour_return: float  # their mean return
    random_return: float | None = None  # reference returns for normalised scores
    expert_return: float | None = None
    sources: list[dict] = field(default_factory=list)  # what wrote it: policies, frames, seeds
    format: int = FORMAT
    # sha256 of the fields' bytes (harness.data.dataset.content_digest); None: written before
    # digests were recorded
    digest: str | None = None
    recipe: dict | None = None  # the recipe it was written from (harness dataset recipe=...)
    checkpoints: dict | None = None  # a recipe's policies: behaviour (and expert), each checkpoint
    # [lowest, highest] return of the episodes that ended inside it (harness.data.returns); None:
    # written before it was recorded
    return_range: list[float] | None = None

    def normalized(self, ret: float) -> float | None:
        """``100 * (ret - random) / (expert - random)``; None without both references."""
        if (
            self.random_return is None
            or self.expert_return is None
            or self.expert_return == self.random_return
        ):
            return None
        return 100 * (ret - self.random_return) / (self.expert_return - self.random_return)

    def reward_normalizer(self, episode_steps: int) -> float:
        """CORL's ``normalize_reward`` for D4RL's locomotion datasets: rewards times
        ``episode_steps / (highest - lowest episode return)``, so that a return range spans about
        one reward a step."""
        if self.return_range is None:
            raise DatasetError(
                "algo.normalize_reward needs the dataset's episode return range, which its "
                "meta.json does not record (written before it was): write the dataset again, or "
                "set algo.reward_scale instead"
            )
        low, high = self.return_range
        if high <= low:
            raise DatasetError(
                f"algo.normalize_reward: every episode of the dataset returned {low:.1f}, there is "
                "no range to scale by: set algo.reward_scale instead"
            )
        return episode_steps / (high - low)
