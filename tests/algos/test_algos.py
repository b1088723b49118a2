"""Algorithm classes: which one a registry entry builds, and their shared pieces."""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from harness.algos import ALGOS, algorithm_for
from harness.algos import critics as critics_module
from harness.algos.cql import CQL, CQLConfig, DiscreteCQL
from harness.algos.critics import Critics, soft_update
from harness.algos.dqn import QPolicy
from harness.algos.nets import mlp
from harness.algos.ranges import AT_LEAST_ONE, ranged
from harness.algos.sac import SACPolicy
from harness.collect.envs import env_spec

PENDULUM, CARTPOLE = env_spec("Pendulum-v1"), env_spec("CartPole-v1")


@pytest.mark.unit
def test_cql_on_a_discrete_env_is_discrete_cql():
    """One resolver, at every call site: the registry name and the env's action space give the
    class."""
    assert algorithm_for("cql", CARTPOLE) is DiscreteCQL
    assert algorithm_for("cql", PENDULUM) is CQL
    assert algorithm_for("sac", PENDULUM) is ALGOS["sac"]  # one form: the class itself
    algo = algorithm_for("cql", CARTPOLE)(CQLConfig(), CARTPOLE, 0)
    assert isinstance(algo, DiscreteCQL) and isinstance(algo.published_models()["policy"], QPolicy)
    # What collectors and evaluators build to receive the weights comes from the same class.
    assert isinstance(
        algorithm_for("cql", CARTPOLE).make_models(CQLConfig(), CARTPOLE)["policy"], QPolicy
    )
    assert isinstance(
        algorithm_for("cql", PENDULUM).make_models(CQLConfig(), PENDULUM)["policy"], SACPolicy
    )
    with pytest.raises(ValueError, match="discrete CQL needs discrete actions"):
        DiscreteCQL(CQLConfig(), PENDULUM, 0)
    with pytest.raises(ValueError, match="continuous CQL needs continuous actions"):
        CQL(CQLConfig(), CARTPOLE, 0)


@pytest.mark.unit
@pytest.mark.parametrize(
    "name,spec",
    [
        ("sac", PENDULUM),
        ("td3", PENDULUM),
        ("dqn", CARTPOLE),
        ("iql", PENDULUM),
        ("cql", PENDULUM),
        ("cql", CARTPOLE),
        ("ppo", CARTPOLE),
    ],
)
def test_checkpointed_state_round_trips(name, spec):
    cls = algorithm_for(name, spec)
    torch.manual_seed(0)
    first = cls(cls.Config(), spec, 1000)
    first.gradient_steps = 7
    torch.manual_seed(1)
    second = cls(cls.Config(), spec, 1000)
    second.load_state_dict(first.state_dict())
    assert second.gradient_steps == 7
    for key, value in first.state_dict().items():
        if isinstance(value, dict) and all(isinstance(v, torch.Tensor) for v in value.values()):
            assert all(torch.equal(v, second.state_dict()[key][k]) for k, v in value.items()), key


def separate_critics(critics: Critics, target: bool = False) -> list[nn.Sequential]:
    """Each ensemble member as the plain ``nn.Sequential`` critic it stands for, with the same
    weights."""
    ensemble = critics.target if target else critics.online
    nets = []
    for e in range(ensemble.weight[0].shape[0]):
        net = mlp(PENDULUM.obs_dim + PENDULUM.num_actions, [16, 16], 1, activation=nn.ReLU)
        with torch.no_grad():
            for linear, w, b in zip(
                [m for m in net if isinstance(m, nn.Linear)], ensemble.weight, ensemble.bias
            ):
                linear.weight.copy_(w[e].T)
                linear.bias.copy_(b[e, 0])
        nets.append(net)
    return nets


@pytest.mark.unit
def test_critics_are_initialised_as_separate_critics_would_be():
    torch.manual_seed(0)
    critics = Critics(PENDULUM, 16)
    torch.manual_seed(0)
    nets = [mlp(4, [16, 16], 1, activation=nn.ReLU) for _ in range(2)]
    for plain, rebuilt in zip(nets, separate_critics(critics)):
        assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), rebuilt.parameters()))
    assert all(
        torch.equal(t, o) for t, o in zip(critics.target.parameters(), critics.online.parameters())
    )


@pytest.mark.unit
@pytest.mark.parametrize("actions", [(), (5,)], ids=["one action", "five actions each"])
def test_batched_critics_equal_separate_critics_in_values_and_gradients(actions, monkeypatch):
    monkeypatch.setattr(
        critics_module, "CPU_ROWS", 7
    )  # blocks of rows give the same numbers as one call
    torch.manual_seed(0)
    critics = Critics(PENDULUM, 16)
    nets = separate_critics(critics)
    obs, action = torch.randn(6, 3), torch.randn(6, *actions, 1)
    q = critics(obs, action)
    x = Critics.inputs(obs, action)
    expected = torch.stack([net(x).squeeze(-1) for net in nets])
    assert q.shape == (2, 6, *actions) and torch.allclose(q, expected, atol=1e-6)
    weights = torch.randn_like(q)  # any loss: every value and gradient must match
    (q * weights).sum().backward()
    (expected * weights).sum().backward()
    for i, (w, b) in enumerate(zip(critics.online.weight, critics.online.bias)):
        linears = [[m for m in net if isinstance(m, nn.Linear)][i] for net in nets]
        assert torch.allclose(
            w.grad, torch.stack([lin.weight.grad.T for lin in linears]), atol=1e-5
        )
        assert torch.allclose(
            b.grad[:, 0], torch.stack([lin.bias.grad for lin in linears]), atol=1e-5
        )


@pytest.mark.unit
def test_frozen_critic_passes_gradient_to_the_action_only():
    torch.manual_seed(0)
    critics = Critics(PENDULUM, 16)
    first = separate_critics(critics)[0]
    obs, action = torch.randn(6, 3), torch.randn(6, 1, requires_grad=True)
    q1 = critics(obs, action, members=1, frozen=True)
    assert q1.shape == (1, 6)
    q1.sum().backward()
    assert all(p.grad is None for p in critics.parameters())
    action_twin = action.detach().clone().requires_grad_()
    first(torch.cat([obs, action_twin], -1)).sum().backward()
    assert torch.allclose(action.grad, action_twin.grad, atol=1e-6)


@pytest.mark.unit
def test_fused_target_update_equals_per_parameter_lerp():
    torch.manual_seed(0)
    critics = Critics(PENDULUM, 16)
    with torch.no_grad():
        for p in critics.online.parameters():
            p.add_(torch.randn_like(p))
    expected = [
        t.clone().lerp_(o, 0.1)
        for t, o in zip(critics.target.parameters(), critics.online.parameters())
    ]
    critics.update_targets(0.1)
    assert all(torch.allclose(t, e) for t, e in zip(critics.target.parameters(), expected))
    net, copy_of = mlp(3, [8], 2), mlp(3, [8], 2)
    soft_update(copy_of, net, 1.0)  # tau 1 copies exactly
    assert all(torch.equal(a, b) for a, b in zip(copy_of.parameters(), net.parameters()))


@pytest.mark.unit
def test_cql_batched_sampled_action_call_equals_the_per_kind_calls():
    torch.manual_seed(0)
    cql = CQL(CQLConfig(hidden=16, n_actions=3), PENDULUM, 0)
    obs, next_obs, action = torch.randn(5, 3), torch.randn(5, 3), torch.rand(5, 1) * 4 - 2
    sampled, log_density, next_action = cql.sampled_actions(obs, next_obs)
    assert (
        sampled.shape == (5, 9, 1) and log_density.shape == (5, 9) and next_action.shape == (5, 1)
    )
    assert torch.allclose(
        log_density[:, :3], torch.tensor(-math.log(4.0))
    )  # uniform on Pendulum's [-2, 2]
    together = cql.critics(obs, torch.cat([action.unsqueeze(1), sampled], 1))
    one_by_one = [cql.critics(obs, action)] + [cql.critics(obs, sampled[:, i]) for i in range(9)]
    assert torch.allclose(together, torch.stack(one_by_one, -1), atol=1e-6)


def seeded_sac_policy() -> tuple[SACPolicy, torch.Tensor]:
    """A small SAC actor and 4 Pendulum observations, then the sampling seed set."""
    torch.manual_seed(0)
    policy, obs = SACPolicy(PENDULUM, 16), torch.randn(4, 3)
    torch.manual_seed(1)
    return policy, obs


@pytest.mark.unit
def test_sac_policy_samples_n_actions_per_observation_as_n_passes_would():
    policy, obs = seeded_sac_policy()
    action, log_prob, mean = policy.sample(obs, 3)
    torch.manual_seed(1)
    action_rep, log_prob_rep, _ = policy.sample(obs.repeat_interleave(3, 0))
    assert action.shape == (4, 3, 1) and log_prob.shape == (4, 3) and mean.shape == (4, 3, 1)
    assert torch.allclose(action.reshape(12, 1), action_rep) and torch.allclose(
        log_prob.reshape(12), log_prob_rep, atol=1e-5
    )


@pytest.mark.unit
def test_sac_policy_log_prob_is_the_squashed_gaussian_density():
    policy, obs = seeded_sac_policy()
    action, log_prob, _ = policy.sample(obs)
    torch.manual_seed(1)
    noise = torch.randn(4, 1)
    h = torch.relu(policy.trunk(obs))
    log_std = -5.0 + 3.5 * (torch.tanh(policy.log_std(h)) + 1)
    normal = torch.distributions.Normal(policy.mean(h), log_std.exp())
    u = normal.mean + noise * normal.stddev
    expected = (normal.log_prob(u) - torch.log(2.0 * (1 - torch.tanh(u).pow(2)) + 1e-6)).sum(-1)
    assert torch.allclose(action, 2.0 * torch.tanh(u)) and torch.allclose(
        log_prob, expected, atol=1e-5
    )


@pytest.mark.unit
def test_sac_policy_log_prob_of_a_given_action_is_the_density_it_was_sampled_with():
    policy, obs = seeded_sac_policy()
    action, log_prob, _ = policy.sample(obs)
    inside = action.abs() < 2.0 * (1 - 1e-4)  # actions on the box's edge are moved inside it
    assert inside.all()
    assert torch.allclose(policy.log_prob(obs, action), log_prob, atol=1e-4)
    edge = policy.log_prob(
        obs, torch.full((4, 1), 2.0)
    )  # a saturated action: finite, not the density at +inf
    assert torch.isfinite(edge).all()


@pytest.mark.unit
@pytest.mark.parametrize(
    "name,spec",
    [
        ("sac", PENDULUM),
        ("td3", PENDULUM),
        ("dqn", CARTPOLE),
        ("iql", PENDULUM),
        ("cql", PENDULUM),
        ("cql", CARTPOLE),
    ],
)
def test_metrics_stay_on_the_device_until_a_log_row_reads_them(name, spec):
    cls = algorithm_for(name, spec)
    algo = cls(cls.Config(batch_size=8, compile=False), spec, 1000)
    g = torch.Generator().manual_seed(0)
    action = (
        torch.randint(0, 2, (8,), generator=g)
        if spec.discrete
        else torch.rand(8, 1, generator=g) * 4 - 2
    )
    data = TensorDict(
        obs=torch.randn(8, spec.obs_dim, generator=g),
        next_obs=torch.randn(8, spec.obs_dim, generator=g),
        reward=torch.randn(8, generator=g),
        terminated=torch.zeros(8, dtype=torch.bool),
        action=action,
        batch_size=[8],
    )
    algo.gradient_steps = 2  # SAC and TD3 update their actor too
    metrics = algo.learn(data)
    assert metrics and all(
        isinstance(v, torch.Tensor) and not v.requires_grad and v.numel() == 1
        for v in metrics.values()
    ), metrics
    assert all(math.isfinite(float(v)) for v in metrics.values())


@pytest.mark.unit
def test_compile_wraps_the_loss_methods_it_names():
    cls = ALGOS["sac"]
    eager, compiled = (
        cls(cls.Config(), PENDULUM, 1000),
        cls(cls.Config(compile=True), PENDULUM, 1000),
    )
    assert cls.compiled == ("critic_loss",)
    assert inspect.ismethod(eager.critic_loss) and not inspect.ismethod(
        compiled.critic_loss
    )  # compiled at the first call


@pytest.mark.unit
def test_compile_by_default_only_where_it_measured_faster():
    """algo.compile=null (the default) compiles continuous CQL only; true and false are obeyed
    everywhere."""
    cql = ALGOS["cql"]
    assert not inspect.ismethod(
        algorithm_for("cql", PENDULUM)(cql.Config(), PENDULUM, 0).critic_losses
    )  # continuous: compiled
    assert inspect.ismethod(
        algorithm_for("cql", CARTPOLE)(cql.Config(), CARTPOLE, 0).losses
    )  # discrete: measured slower compiled
    assert inspect.ismethod(
        algorithm_for("cql", PENDULUM)(cql.Config(compile=False), PENDULUM, 0).critic_losses
    )
    assert not inspect.ismethod(
        algorithm_for("cql", CARTPOLE)(cql.Config(compile=True), CARTPOLE, 0).losses
    )


@pytest.mark.unit
@pytest.mark.slow
def test_compiled_loss_equals_the_eager_one():
    """DQN's TD loss has no sampling in it: compiled and eager must agree on the same weights and
    batch."""
    cls = ALGOS["dqn"]
    torch.manual_seed(0)
    eager = cls(cls.Config(), CARTPOLE, 1000)
    torch.manual_seed(0)
    compiled = cls(cls.Config(compile=True), CARTPOLE, 1000)
    g = torch.Generator().manual_seed(0)
    data = TensorDict(
        obs=torch.randn(8, 4, generator=g),
        next_obs=torch.randn(8, 4, generator=g),
        reward=torch.randn(8, generator=g),
        terminated=torch.rand(8, generator=g) < 0.3,
        action=torch.randint(0, 2, (8,), generator=g),
        batch_size=[8],
    )
    (loss, q), (loss_c, q_c) = eager.td_loss(data), compiled.td_loss(data)
    assert torch.allclose(loss, loss_c, atol=1e-6) and torch.allclose(q, q_c, atol=1e-6)
    loss.backward(), loss_c.backward()
    assert all(
        torch.allclose(a.grad, b.grad, atol=1e-6)
        for a, b in zip(eager.policy.parameters(), compiled.policy.parameters())
    )


@pytest.mark.unit
@pytest.mark.parametrize("name", ["td3", "sac"])
def test_off_policy_actors_store_the_action_the_env_runs(name):
    """A saturated actor plus exploration noise: every action a collector stores lies in the box
    (TD3 clips its noisy action, SAC's is squashed), so the replay holds what the env ran, as
    CleanRL's does."""
    cls = ALGOS[name]
    policy = cls.make_policy(cls.Config(), PENDULUM)
    with torch.no_grad():
        (policy.mean if name == "sac" else policy.net[-1]).bias.fill_(
            20.0
        )  # tanh saturates at the top of the box
    action = policy(torch.randn(4096, 3))["action"]
    assert float(action.max()) <= 2.0 and float(action.min()) >= -2.0
    assert (
        float((action == 2.0).float().mean()) > 0.3
    )  # saturated: TD3's noise pushed about half past the edge


@pytest.mark.unit
def test_ppo_stores_its_unclipped_gaussian_sample_whose_log_prob_it_records():
    policy = ALGOS["ppo"].make_policy(ALGOS["ppo"].Config(), PENDULUM)
    with torch.no_grad():
        policy.net[-1].bias.fill_(2.0)  # the mean at the edge of Pendulum's [-2, 2]
    obs = torch.randn(4096, 3)
    out = policy(obs)
    assert float(out["action"].max()) > 2.0  # the sample, not the env's clipped copy
    assert torch.allclose(out["logprob"], policy.log_prob_entropy(obs, out["action"])[0])


@pytest.mark.unit
def test_a_field_takes_the_range_declared_on_it_and_none_without_one():
    """Ranges live on the fields (``ranged``): a new field is checked only if it declares one,
    whatever its name (``warmup_steps`` would have been refused by a name-suffix table)."""

    @dataclasses.dataclass
    class WithWarmup(ALGOS["sac"].Config):
        warmup_steps: int = 0  # no declared range: any int
        warmup_frames: int = ranged(1, AT_LEAST_ONE)

    assert WithWarmup(warmup_steps=0).warmup_steps == 0
    with pytest.raises(
        ValueError, match=r"algo.warmup_frames=0 is out of range: algo=sac needs it >= 1"
    ):
        WithWarmup(warmup_frames=0)
    with pytest.raises(
        ValueError, match=r"algo.tau=0 is out of range: algo=sac needs it in \(0, 1\]"
    ):
        WithWarmup(tau=0)  # the inherited fields keep theirs
