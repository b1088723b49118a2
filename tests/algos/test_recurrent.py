"""Policies with memory (algo.memory, harness/algos/memory.py): the state never crosses an episode
boundary, each segment starts from the state its collector had, no minibatch cuts a sequence, and
the trainer's forward over a segment gives back what the collector computed while acting."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import flaky_env
import pytest
import torch
from helpers import ROOT, column, compose_config, rows, run_harness
from tensordict import TensorDict

from harness.algos.base import Policy
from harness.algos.memory import INITIAL_STATE, STATE, RecurrentActorCritic, groups
from harness.algos.ppo import PPO, PPOConfig
from harness.collect.envs import make_vec_env, spec_of
from harness.collect.evaluate import evaluate
from harness.collect.rollout import RolloutCollector
from harness.sync import Header

MEMORIES = ["gru", "lstm"]
ENVS, STEPS = 6, 48  # CartPole episodes under an untrained policy end within ~10-40 steps


class Recording(Policy):
    """``policy``, noting the state each call was given and the state it returned."""

    def __init__(self, policy: Policy):
        super().__init__()
        self.policy = policy
        self.given: list[torch.Tensor | None] = []
        self.returned: list[torch.Tensor] = []

    def forward(
        self,
        obs: torch.Tensor,
        values: Mapping[str, float] = {},
        deterministic: bool = False,
        **state: torch.Tensor,
    ) -> TensorDict:
        self.given.append(state.get("state"))
        out = self.policy(obs, values, deterministic, **state)
        self.returned.append(out[STATE].clone())
        return out


def watch_minibatches(algo: PPO, monkeypatch) -> tuple[list[TensorDict], list[dict]]:
    """Each minibatch ``algo``'s update steps on, and the losses of each step, from now on."""
    minibatches: list[TensorDict] = []
    losses: list[dict[str, torch.Tensor]] = []
    step = algo.minibatch_step

    def noted(mb: TensorDict) -> dict[str, torch.Tensor]:
        minibatches.append(mb.clone())
        losses.append(step(mb))
        return losses[-1]

    monkeypatch.setattr(algo, "minibatch_step", noted)
    return minibatches, losses


def ppo(memory: str, seed: int = 0, **settings) -> PPO:
    torch.manual_seed(seed)
    cfg = PPOConfig(memory=memory, memory_size=16, hidden_sizes=[16], **settings)
    return PPO(cfg, spec_of(make_vec_env("CartPole-v1", 1)), total_frames=10_000)


def collector_of(policy: Policy, env_id: str = "CartPole-v1", **kwargs) -> RolloutCollector:
    envs = make_vec_env(env_id, ENVS, **kwargs)
    collector = RolloutCollector(envs, policy, ENVS * STEPS, seed=3)
    if isinstance(policy, Recording):  # from the first step on, not the batch layout's dummy call
        policy.given.clear()
        policy.returned.clear()
    return collector


@pytest.mark.unit
@pytest.mark.parametrize("memory", MEMORIES)
def test_the_collector_zeroes_a_state_after_the_step_that_ended_its_episode(memory):
    policy = Recording(ppo(memory).policy)
    done = collector_of(policy).collect(Header(0))["rollout", "done"]
    assert done[:-1].any(), "no episode ended: the test needs some"
    for t in range(1, STEPS):
        given, before = policy.given[t], policy.returned[t - 1]
        assert given is not None
        for i in range(ENVS):
            if done[t - 1, i]:
                assert torch.equal(given[i], torch.zeros_like(given[i])), (t, i)
            else:  # carried as it was, and not zero
                assert torch.equal(given[i], before[i]) and before[i].abs().sum() > 0, (t, i)


@pytest.mark.unit
def test_a_restarted_env_and_a_reset_collector_start_from_a_zero_state(monkeypatch):
    """An env that raises is made again and its broken episode ends (a truncation): its state is
    zeroed; ``reset`` (a resumed run's reseeding) zeroes every env's."""
    monkeypatch.setenv("FLAKY_STEP", "5")
    monkeypatch.setenv("FLAKY_FAILURES", "1")
    monkeypatch.setattr(flaky_env, "failures", 0)
    policy = Recording(ppo("gru").policy)
    collector = collector_of(policy, "flaky_env:FlakyCartPole-v0", max_restarts=1)
    batch = collector.collect(Header(0))
    assert float(batch["stats", "env_restarts"]) == 1
    restart_step = int(batch["rollout", "truncated"].any(1).nonzero()[0])
    after = policy.given[restart_step + 1]
    assert after is not None
    broken = batch["rollout", "truncated"][restart_step]
    assert torch.equal(after[broken], torch.zeros_like(after[broken]))
    assert collector.state is not None and collector.state.abs().sum() > 0
    collector.reset(seed=11)
    collector.collect(Header(1))
    assert torch.equal(collector.batch[INITIAL_STATE], torch.zeros(ENVS, 16))


@pytest.mark.unit
@pytest.mark.parametrize("memory", MEMORIES)
def test_a_segment_starts_from_the_state_its_collector_had_at_its_first_step(memory):
    policy = Recording(ppo(memory).policy)
    collector = collector_of(policy)
    collector.collect(Header(0))
    first_of_second = len(policy.given)
    initial = collector.collect(Header(1))[INITIAL_STATE]
    acted_from = policy.given[first_of_second]
    assert acted_from is not None and initial.abs().sum() > 0
    assert torch.equal(initial, acted_from)


@pytest.mark.unit
@pytest.mark.parametrize("memory", MEMORIES)
def test_the_trainers_forward_restarts_from_zero_where_an_episode_ended(memory):
    """Over a segment with an end after step 4 of env 0, the forward equals two forwards: one up to
    that step, and one from a zero state after it; the state carried on would give other values."""
    policy = ppo(memory).policy
    assert policy.memory is not None
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(10, 3, 4, generator=g)
    state = torch.randn(3, policy.memory.state_size, generator=g)
    done = torch.zeros(10, 3, dtype=torch.bool)
    done[4, 0] = True
    with torch.no_grad():
        _, values = policy.unroll(obs, state, done)
        _, before = policy.unroll(obs[:5, :1], state[:1], done[:5, :1])
        zero = torch.zeros_like(state[:1])
        _, after = policy.unroll(obs[5:, :1], zero, done[5:, :1])
        _, carried = policy.unroll(obs[:, :1], state[:1], torch.zeros(10, 1, dtype=torch.bool))
    torch.testing.assert_close(values[:5, 0], before[:, 0])
    torch.testing.assert_close(values[5:, 0], after[:, 0])
    assert not torch.allclose(values[5:, 0], carried[5:, 0], atol=1e-4)


def core_of(memory: str) -> RecurrentActorCritic:
    core = ppo(memory).policy.memory
    assert core is not None
    return core


def stepped(core: RecurrentActorCritic, obs: torch.Tensor, state: torch.Tensor, done: torch.Tensor):
    """The reference for ``core.unroll``: its cell stepped once per frame, the state zeroed after
    each step that ended an episode."""
    features, outs = core.encoder(obs), []
    for t in range(obs.shape[0]):
        if t:
            state = state * (~done[t - 1]).float().unsqueeze(-1)
        if core.lstm:
            h, c = core.cell(features[t], tuple(state.chunk(2, -1)))
            state = torch.cat([h, c], -1)
        else:
            h = state = core.cell(features[t], state)
        outs.append(h)
    out, (weight, bias) = torch.stack(outs), (core.heads.weight, core.heads.bias)
    # the actor's head and the value head as two layers: the first rows and the last
    return out @ weight[:-1].T + bias[:-1], out @ weight[-1] + bias[-1]


@pytest.mark.unit
@pytest.mark.parametrize("memory", MEMORIES)
def test_acting_in_one_function_samples_what_the_modules_and_categorical_do(memory):
    """The collector's step (harness/algos/memory_act.py) against torch's own modules and
    ``Categorical`` from the same random state: the same actions, log-probabilities, values and
    next states, to the bit, for a state carried over several steps."""
    policy = ppo(memory).policy
    core = policy.memory
    assert core is not None
    g = torch.Generator().manual_seed(1)
    obs, state = torch.randn(5, 7, 4, generator=g), torch.randn(7, core.state_size, generator=g)
    mine, theirs = state, state
    with torch.no_grad():
        for t in range(5):
            torch.manual_seed(t)
            out = policy(obs[t], state=mine)
            features = core.encoder(obs[t])
            if core.lstm:
                h, c = core.cell(features, tuple(theirs.chunk(2, -1)))
                theirs = torch.cat([h, c], -1)
            else:
                h = theirs = core.cell(features, theirs)
            both = core.heads(h)
            dist = torch.distributions.Categorical(logits=both[:, :-1])
            torch.manual_seed(t)
            action = dist.sample()
            assert torch.equal(out["action"], action)
            assert torch.equal(out["logprob"], dist.log_prob(action))
            assert torch.equal(out["value"], both[:, -1])
            assert torch.equal(out[STATE], theirs)
            mine = out[STATE]


@pytest.mark.unit
@pytest.mark.parametrize("grouping", ["chosen", "one-call", "call-per-length"])
@pytest.mark.parametrize("memory", MEMORIES)
def test_the_fused_unroll_computes_what_the_stepped_cell_does(memory, grouping, monkeypatch):
    """Values, actor outputs and every gradient (weights, recorded states) as the cell stepped once
    per frame, with ends after the first and the second-to-last step, in the middle, one after
    another, at every step of one env, at the last step, and none in another env: as the core
    chooses on a CPU (the GRU: its TorchScript loop, harness/algos/gru_loop.py; the LSTM: its
    pieces grouped), and the pieces between ends in one fused call and in one call per length
    (the GRU's way on a GPU)."""
    if grouping == "chosen":
        assert core_of(memory).stepped(torch.zeros(1)) == (memory == "gru")
    else:  # every grouping's extremes, in torch's fused calls
        costs = None if grouping == "one-call" else (0.0, 0.0)
        monkeypatch.setattr(RecurrentActorCritic, "CALL_COSTS", {"lstm": costs, "gru": costs})
        monkeypatch.setattr(RecurrentActorCritic, "stepped", lambda core, features: False)
    core = ppo(memory).policy.memory
    assert core is not None
    g = torch.Generator().manual_seed(1)
    steps, envs = 12, 6
    obs = torch.randn(steps, envs, 4, generator=g)
    done = torch.zeros(steps, envs, dtype=torch.bool)
    done[0, 0] = done[steps - 2, 1] = done[steps - 1, 2] = True
    done[3:5, 3] = done[6, 0] = done[6, 4] = True
    done[:, 5] = True
    results = []
    for unroll in (core.unroll, partial(stepped, core)):
        core.zero_grad()
        state = torch.randn(envs, core.state_size, generator=torch.Generator().manual_seed(2))
        state.requires_grad_(True)
        out, values = unroll(obs, state, done)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
        ((out * weights).sum() + (values * values).sum()).backward()
        grads = [p.grad.clone() for p in core.parameters()]
        results.append((out.detach(), values.detach(), state.grad, grads))
    (out, values, state_grad, grads), (out_ref, values_ref, state_grad_ref, grads_ref) = results
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close(values, values_ref)
    torch.testing.assert_close(state_grad, state_grad_ref)
    for grad, grad_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(grad, grad_ref)


@pytest.mark.unit
def test_pieces_are_grouped_for_the_fewest_padded_frames_plus_calls():
    """Lengths 64, 60, 5, 3 at 32 frames a call: {64, 60} and {5, 3} cost 2 x 64 + 2 x 5 + 2 x 32
    = 202, less than one group (288), one a length (260) or {64}, {60}, {5, 3} (230)."""
    lengths = [5, 60, 64, 3]
    order, bounds = groups(lengths, (32.0, 0.0))
    assert order == [2, 1, 0, 3] and bounds == [0, 2, 4]
    assert groups(lengths, None) == (order, [0, 4])
    assert groups(lengths, (0.0, 0.0)) == (order, [0, 1, 2, 3, 4])
    assert groups([7, 7, 7], (0.0, 0.0)) == ([0, 1, 2], [0, 3])  # equal lengths: never apart
    # each time step costing 40 frames more: {64, 60, 5, 3} (4 x 64 + 40 x 64 + 32 = 2848) is
    # cheaper than {64, 60}, {5, 3} (2 x 64 + 40 x 64 + 32 + 2 x 5 + 40 x 5 + 32 = 2962)
    assert groups(lengths, (32.0, 40.0)) == (order, [0, 4])


@pytest.mark.unit
@pytest.mark.parametrize("memory", MEMORIES)
def test_the_trainers_forward_gives_back_the_collectors_log_probs_and_values(memory, monkeypatch):
    """The same weights, replayed by the trainer over the collector's second segment from its
    recorded state, with the episodes that ended in it: every step's log-probability and value
    as the collector computed them while acting, and the first minibatch's ratio 1."""
    algo = ppo(memory, num_minibatches=1)
    collector = collector_of(algo.policy)
    collector.collect(Header(0))
    batch = collector.collect(Header(1))
    rollout, initial = batch["rollout"], batch[INITIAL_STATE]
    assert rollout["done"].any() and initial.abs().sum() > 0, "the test needs both"
    values, _, logprob = algo.replay(rollout["obs"], rollout, initial, batch["next_obs"])
    torch.testing.assert_close(logprob, rollout["logprob"], rtol=0, atol=1e-5)
    torch.testing.assert_close(values, rollout["value"], rtol=0, atol=1e-5)

    _, losses = watch_minibatches(algo, monkeypatch)
    algo.update([batch], 0)
    assert float(losses[0]["approx_kl"]) < 1e-9 and float(losses[0]["clipfrac"]) == 0.0


@pytest.mark.unit
@pytest.mark.parametrize("memory", MEMORIES)
def test_a_minibatch_holds_whole_env_sequences_from_their_recorded_states(memory, monkeypatch):
    algo = ppo(memory, num_minibatches=3, update_epochs=2)
    collector = collector_of(algo.policy)
    collector.collect(Header(0))
    batch = collector.collect(Header(1)).clone()
    obs, initial = batch["rollout", "obs"], batch[INITIAL_STATE]
    minibatches, _ = watch_minibatches(algo, monkeypatch)
    algo.update([batch], 0)
    assert len(minibatches) == 2 * 3
    for epoch in (minibatches[:3], minibatches[3:]):
        envs = []
        for mb in epoch:
            assert mb["obs"].shape[:2] == (ENVS // 3, STEPS)  # every step of 2 envs' sequences
            for sequence, state in zip(mb["obs"], mb[INITIAL_STATE]):
                matches = [i for i in range(ENVS) if torch.equal(sequence, obs[:, i])]
                assert len(matches) == 1
                assert torch.equal(state, initial[matches[0]])
                envs += matches
        assert sorted(envs) == list(range(ENVS))  # each env's sequence once per epoch


@pytest.mark.unit
def test_evaluation_carries_each_envs_state_and_starts_every_episode_from_zero():
    policy = Recording(ppo("lstm").policy)
    envs = make_vec_env("CartPole-v1", 3, training=False)
    evaluate(policy, envs, seed=5, values={})
    assert policy.given[0] is None  # an episode's start: the policy's zero state
    for t in range(1, len(policy.given)):
        given = policy.given[t]
        assert given is not None
        for i in range(3):
            ended = given[i].abs().sum() == 0
            assert ended or torch.equal(given[i], policy.returned[t - 1][i]), (t, i)


@pytest.mark.unit
def test_a_memory_that_is_not_one_gets_one_clear_error():
    with pytest.raises(ValueError, match=r"algo\.memory='lstmm': choose none \(.*\), lstm or gru"):
        compose_config("algo.memory=lstmm")


@pytest.mark.e2e
def test_ppo_with_a_gru_on_a_popgym_task_runs_with_a_collector_and_logs_rows(workdir):
    pytest.importorskip("popgym", reason="the popgym extra: pip install -e '.[popgym]'")
    out = run_harness(
        [
            "algo=ppo",
            "algo.memory=gru",
            "algo.memory_size=32",
            "env=popgym_repeat_previous_easy",
            "debug=tiny",
            "logger.console=false",
            "run_dir=run",
        ],
        workdir,
        nproc=2,
        env={"PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    table = rows(workdir / "run")
    assert int(table[-1]["frames"]) == 1024
    assert column(table, "train/policy_loss") and column(table, "train/episode_return")
