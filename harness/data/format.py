"""What an offline dataset is, whoever reads it: its fields, its meta, its error.

:mod:`harness.data.dataset` (the harness's own directories) and
:mod:`harness.data.minari` (Minari's) both produce these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
FORMAT = 1


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

    def normalized(self, ret: float) -> float | None:
        """``100 * (ret - random) / (expert - random)``; None without both references."""
        if (
            self.random_return is None
            or self.expert_return is None
            or self.expert_return == self.random_return
        ):
            return None
        return 100 * (ret - self.random_return) / (self.expert_return - self.random_return)
