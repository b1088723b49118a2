"""Algorithms, selected by ``algo.name``.

Adding one: a file with its config dataclass, policy and ``Algorithm``
subclass; one line in ``ALGOS``; one ``conf/algo/<name>.yaml``.

An entry may have a form per action space (``cql``: ``DiscreteCQL`` for
discrete actions), so a trainer builds
``ALGOS[name].for_spec(spec)(cfg, spec, total_frames, ddp_group)``;
``ALGOS[name].make_policy(cfg, spec)`` already picks the right policy.
"""

from __future__ import annotations

from harness.algos.base import AlgoConfig, Algorithm, Policy
from harness.algos.cql import CQL
from harness.algos.dqn import DQN
from harness.algos.iql import IQL
from harness.algos.ppo import PPO
from harness.algos.sac import SAC
from harness.algos.td3 import TD3

ALGOS: dict[str, type[Algorithm]] = {"ppo": PPO, "sac": SAC, "td3": TD3, "dqn": DQN, "iql": IQL, "cql": CQL}

__all__ = ["ALGOS", "AlgoConfig", "Algorithm", "Policy"]
