"""What both forms of Conservative Q-Learning share: the config of
``algo=cql`` and the conservative penalty (Kumar et al. 2020, CQL(H)).

Continuous actions: harness/algos/cql.py; discrete: harness/algos/cql_discrete.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.algos.offline import OfflineConfig
from harness.algos.ranges import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT, ranged


@dataclass
class CQLConfig(OfflineConfig):
    """Defaults follow CORL's ``cql.py`` for D4RL locomotion, where they apply."""

    name: str = "cql"
    # weight of the conservative penalty, for rewards of about 1 a step (see reward_scale)
    cql_alpha: float = ranged(5.0, NON_NEGATIVE)
    # continuous: actions sampled per kind (uniform, pi(s), pi(s')) for the soft maximum
    n_actions: int = ranged(10, AT_LEAST_ONE)
    temperature: float = ranged(1.0, POSITIVE)  # of the soft maximum
    lagrange: bool = False  # continuous: tune the penalty's weight towards target_action_gap
    # with lagrange: the wanted soft-max(Q) - Q(data) gap
    target_action_gap: float = ranged(10.0, NON_NEGATIVE)
    # continuous: actor's and entropy weight's Adam learning rate
    actor_lr: float = ranged(1e-4, POSITIVE)
    # Continuous: the actor's first gradient steps clone the dataset's actions instead of maximising
    # Q (the CQL paper's code, 10k-40k steps): the critics' targets then use actions near the data's
    # from the start.
    bc_steps: int = ranged(0, NON_NEGATIVE)
    # critics' (and the Lagrange weight's) Adam learning rate
    critic_lr: float = ranged(3e-4, POSITIVE)
    tau: float = ranged(0.005, UNIT)  # target critics' smoothing coefficient (discrete: 1 copies)
    target_update_every: int = ranged(1, AT_LEAST_ONE)  # gradient steps between target updates
    hidden: int = ranged(256, AT_LEAST_ONE)  # width of every network's two hidden layers


def cql_penalty(
    q_sampled: torch.Tensor,
    log_density: torch.Tensor,
    q_data: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``mean(T * logsumexp((Q(s, a_i) - log p(a_i)) / T, i) - Q(s, a_data))``:
    a soft maximum of Q over sampled actions ``[..., B, N]`` (importance-weighted
    by the density they were drawn with) minus Q on the dataset's actions ``[..., B]``;
    the mean runs over the last dimension (leading ones, such as critics, are kept)."""
    soft_max = temperature * torch.logsumexp((q_sampled - log_density) / temperature, dim=-1)
    return (soft_max - q_data).mean(-1)
