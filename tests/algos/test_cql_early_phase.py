"""CQL's early phase on a task whose true Q is known: reward +1 every step, no terminals, so Q = 1 /
(1 - gamma) = 100 on every state and action. A conservative critic may sit below 100, never below 0
(no return here is negative). With the actor and entropy weight learning at 3e-5 (CORL's
hopper-medium settings) and the actor cloning the data first, it stays broad for thousands of steps;
every backup through its actions at s' is pushed down by the penalty, and Q on the data falls
towards -100 (docs/offline.md, "CQL's early phase")."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import compose_config
from tensordict import TensorDict

from harness.algos.cql import CQL
from harness.collect.envs import env_spec
from harness.core.specs import EnvSpec

STEPS = 500  # the old settings fell to -16 by 500 steps (and -80 by 1,000): 500 sees them fall


def constant_reward_data(spec: EnvSpec, n: int = 20_000) -> TensorDict:
    """A behaviour policy's data (a fixed tanh-linear map of the state, plus noise) on random
    states; reward 1."""
    g = torch.Generator().manual_seed(0)
    low, high = torch.tensor(spec.action_low), torch.tensor(spec.action_high)
    obs = torch.randn(n, spec.obs_dim, generator=g)
    weights = torch.randn(spec.obs_dim, spec.num_actions, generator=g) / spec.obs_dim**0.5
    unit = (
        torch.tanh(obs @ weights) * 0.8 + 0.1 * torch.randn(n, spec.num_actions, generator=g)
    ).clamp(-1, 1)
    return TensorDict(
        obs=obs,
        action=(low + high) / 2 + unit * (high - low) / 2,
        reward=torch.ones(n),
        next_obs=torch.randn(n, spec.obs_dim, generator=g),
        terminated=torch.zeros(n, dtype=torch.bool),
        truncated=torch.zeros(n, dtype=torch.bool),
        batch_size=[n],
    )


@pytest.mark.unit
@pytest.mark.slow
@pytest.mark.parametrize("preset", ["cql_hopper", "cql_pendulum"])
def test_cql_presets_keep_q_on_the_data_above_zero_where_it_is_100(preset):
    cfg = compose_config(f"experiment={preset}")
    spec = env_spec(cfg.env.id)
    # The rewards are +1 already (what reward_scale makes of the task's); compiling changes how, not
    # what.
    algo_cfg = dataclasses.replace(cfg.algo, reward_scale=1.0, compile=False)
    torch.manual_seed(0)
    cql = CQL(algo_cfg, spec, 0)
    cql.use_dataset(constant_reward_data(spec))
    q_on_data = [float(cql.update([], 0)["train/q1"]) for _ in range(STEPS)]
    late = sum(q_on_data[-100:]) / 100
    assert late > 0.0, (
        f"{preset}: Q on the data fell to {late:.1f} after {STEPS} steps where every return is "
        f"+100: "
        f"the penalty's backups through a broad actor (actor_lr {algo_cfg.actor_lr}, bc_steps "
        f"{algo_cfg.bc_steps})"
    )
