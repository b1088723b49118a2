"""Algorithms, selected by ``algo.name``.

Adding one: a file with its config dataclass, policy and ``Algorithm``
subclass; one line in ``ALGOS``; one ``conf/algo/<name>.yaml``.
"""

from __future__ import annotations

from harness.algos.base import AlgoConfig, Algorithm, Policy
from harness.algos.ppo import PPO

ALGOS: dict[str, type[Algorithm]] = {"ppo": PPO}

__all__ = ["ALGOS", "AlgoConfig", "Algorithm", "Policy"]
