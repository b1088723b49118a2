"""Algorithm classes: which one a registry entry builds, and their shared pieces."""

from __future__ import annotations

import pytest
import torch

from harness.algos import ALGOS
from harness.algos.cql import CQL, CQLConfig, DiscreteCQL
from harness.algos.dqn import QPolicy
from harness.algos.sac import SACPolicy
from harness.collect.envs import env_spec

PENDULUM, CARTPOLE = env_spec("Pendulum-v1"), env_spec("CartPole-v1")


def test_cql_on_a_discrete_env_is_discrete_cql():
    assert ALGOS["cql"].for_spec(CARTPOLE) is DiscreteCQL
    assert ALGOS["cql"].for_spec(PENDULUM) is CQL
    assert ALGOS["sac"].for_spec(PENDULUM) is ALGOS["sac"]  # one form: the class itself
    algo = ALGOS["cql"].for_spec(CARTPOLE)(CQLConfig(), CARTPOLE, 0)
    assert isinstance(algo, DiscreteCQL) and isinstance(algo.published_models()["policy"], QPolicy)
    # Collectors ask the registry entry for the policy alone.
    assert isinstance(ALGOS["cql"].make_policy(CQLConfig(), CARTPOLE), QPolicy)
    assert isinstance(ALGOS["cql"].make_policy(CQLConfig(), PENDULUM), SACPolicy)
    with pytest.raises(ValueError, match="discrete CQL needs discrete actions"):
        DiscreteCQL(CQLConfig(), PENDULUM, 0)


@pytest.mark.parametrize("name,spec", [("sac", PENDULUM), ("td3", PENDULUM), ("dqn", CARTPOLE), ("iql", PENDULUM),
                                       ("cql", PENDULUM), ("cql", CARTPOLE), ("ppo", CARTPOLE)])
def test_checkpointed_state_round_trips(name, spec):
    cls = ALGOS[name].for_spec(spec)
    torch.manual_seed(0)
    first = cls(cls.Config(), spec, 1000)
    torch.manual_seed(1)
    second = cls(cls.Config(), spec, 1000)
    second.load_state_dict(first.state_dict())
    for key, value in first.state_dict().items():
        if isinstance(value, dict) and all(isinstance(v, torch.Tensor) for v in value.values()):
            assert all(torch.equal(v, second.state_dict()[key][k]) for k, v in value.items()), key
