"""TorchRL's side of ``benchmarks/seed_table.py``: the cases of TorchRL 0.14.1's
``benchmarks/test_objectives_benchmarks.py`` and ``benchmarks/test_replaybuffer_benchmark.py``,
built as those tests build them, under the names the harness's side (seed_harness.py) uses.

Imported only by ``seed_table.py --side torchrl``, in the Python given as ``--peer``: the project's
environment has no torchrl, and never needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from tensordict import TensorDict
from tensordict.nn import InteractionType, NormalParamExtractor, set_composite_lp_aggregate
from tensordict.nn import ProbabilisticTensorDictModule as ProbMod
from tensordict.nn import ProbabilisticTensorDictSequential as ProbSeq
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
from torchrl.data import TensorDictReplayBuffer as Buffer
from torchrl.data.replay_buffers import RandomSampler
from torchrl.data.tensor_specs import Bounded, Unbounded
from torchrl.modules import MLP, QValueActor, TanhNormal
from torchrl.objectives import ClipPPOLoss, CQLLoss, DQNLoss, IQLLoss, SACLoss, TD3Loss
from torchrl.objectives.value import GAE
from torchrl.objectives.value.functional import (
    vec_generalized_advantage_estimate,
    vtrace_advantage_estimate,
)

Call = Callable[[], object]
Case = tuple[Call, Call | None]  # the timed call, and what runs untimed before each call
# The objective tests' defaults: observation and action dims, MLP width, trunk features, batch.
N_OBS, N_ACT, NCELLS, N_HIDDEN, N = 8, 4, 128, 64, 128


def value_cases() -> dict[str, Case]:
    """test_gae_speed's and test_values' GAE (the vectorised one, gamma a float), and TorchRL's
    V-trace at test_gae_speed's shapes (it has no benchmark case of its own)."""
    cases: dict[str, Case] = {}
    for b, t, gamma in ((1, 512, 0.99), (32, 512, 0.99), (300, 500, 0.95)):
        torch.manual_seed(0)
        size = (b, t, 1)
        value, next_value, reward = torch.randn(size), torch.randn(size), torch.randn(size)
        done = torch.zeros(size, dtype=torch.bool).bernoulli_(0.1)
        gae = partial(
            vec_generalized_advantage_estimate,
            gamma=gamma,
            lmbda=0.95,
            state_value=value,
            next_state_value=next_value,
            reward=reward,
            done=done,
        )
        cases[f"value/gae/{b}x{t}"] = (gae, None)
        if t == 512:
            log_pi, log_mu = 0.1 * torch.randn(size), torch.zeros(size)
            cases[f"value/vtrace/{b}x{t}"] = (
                partial(
                    vtrace_advantage_estimate, 0.99, log_pi, log_mu, value, next_value, reward, done
                ),
                None,
            )
    return cases


def mlp(inputs: int, outputs: int, depth: int) -> MLP:
    return MLP(in_features=inputs, out_features=outputs, depth=depth, num_cells=NCELLS)


def batch(*shape: int) -> TensorDict:
    """The continuous-action tests' batch (with ``action_log_prob`` where it is ``[B, T]``)."""
    log_prob = {"action_log_prob": torch.randn(*shape)} if len(shape) == 2 else {}
    return TensorDict(
        {
            "obs": torch.randn(*shape, N_OBS),
            "action": torch.randn(*shape, N_ACT),
            **log_prob,
            "done": torch.zeros(*shape, 1, dtype=torch.bool),
            "next": {
                "obs": torch.randn(*shape, N_OBS),
                "reward": torch.randn(*shape, 1),
                "done": torch.zeros(*shape, 1, dtype=torch.bool),
            },
        },
        list(shape),
        names=[None, "time"] if len(shape) == 2 else None,  # type: ignore[list-item]
    )


def actor_critic(*keys: str, **actor_kwargs: Any) -> tuple[Any, ...]:
    """The tests' TanhNormal actor on a trunk (depth 3 to 64 features), and a head on the same trunk
    for each of ``keys`` (``state_action_value`` takes the action too)."""
    common = Mod(mlp(N_OBS, N_HIDDEN, 3), in_keys=["obs"], out_keys=["hidden"])
    actor = ProbSeq(
        common,
        Mod(mlp(N_HIDDEN, 2 * N_ACT, 2), in_keys=["hidden"], out_keys=["param"]),
        Mod(NormalParamExtractor(), in_keys=["param"], out_keys=["loc", "scale"]),
        ProbMod(
            in_keys=["loc", "scale"],
            out_keys=["action"],
            distribution_class=TanhNormal,
            distribution_kwargs={"safe_tanh": False},
            **actor_kwargs,
        ),
    )
    heads = [
        Seq(common, Mod(mlp(N_HIDDEN + N_ACT, 1, 2), ["hidden", "action"], [key]))
        if key == "state_action_value"
        else Seq(common, Mod(mlp(N_HIDDEN, 1, 2), ["hidden"], [key]))
        for key in keys
    ]
    return actor, *heads


def dqn() -> tuple[Any, TensorDict]:
    value = QValueActor(mlp(N_OBS, N_ACT, 3), in_keys=["obs"], action_space="one-hot")
    td = TensorDict(
        {
            "obs": torch.randn(N, N_OBS),
            "action": torch.nn.functional.one_hot(torch.randint(N_ACT, (N,))),
            "next": {
                "obs": torch.randn(N, N_OBS),
                "done": torch.zeros(N, 1, dtype=torch.bool),
                "reward": torch.randn(N, 1),
            },
        },
        [N],
    )
    return DQNLoss(value_network=value, action_space="one-hot"), td


def q_learning(kind: Any, spec: Any, **actor_kwargs: Any) -> tuple[Any, TensorDict]:
    """test_sac_speed's, test_td3_speed's and test_cql_speed's loss: ``kind`` on the actor and a
    Q head."""
    actor, qvalue = actor_critic("state_action_value", **actor_kwargs)
    td = batch(N)
    qvalue(actor(td.clone()))
    return kind(actor, qvalue, action_spec=spec), td


def ppo() -> tuple[Any, TensorDict]:
    (actor, critic), td = actor_critic("state_value"), batch(N, 10)
    actor(td.clone())
    critic(td.clone())
    GAE(value_network=critic, gamma=0.99, lmbda=0.95, shifted=True)(td)
    return ClipPPOLoss(actor_network=actor, critic_network=critic), td


def iql() -> tuple[Any, TensorDict]:
    (actor, value, qvalue), td = actor_critic("state_value", "state_action_value"), batch(N, 10)
    qvalue(actor(td.clone()))
    value(td.clone())
    return IQLLoss(actor_network=actor, value_network=value, qvalue_network=qvalue), td


def loss_cases() -> dict[str, Case]:
    """Each objective test's ``forward`` (``loss(td)``) and ``fwd+bwd`` (the ``loss*`` entries
    summed and back-propagated, after an untimed ``loss.zero_grad``), eager."""
    set_composite_lp_aggregate(False).set()  # the PPO and IQL tests require it
    deterministic = {
        "return_log_prob": True,
        "default_interaction_type": InteractionType.DETERMINISTIC,
    }
    losses = {
        "dqn": dqn(),
        "sac": q_learning(SACLoss, Unbounded(shape=(N_ACT,))),
        "td3": q_learning(TD3Loss, Bounded(shape=(N_ACT,), low=-1, high=1), **deterministic),
        "cql": q_learning(CQLLoss, Unbounded(shape=(N_ACT,))),
        "ppo": ppo(),
        "iql": iql(),
    }
    cases: dict[str, Case] = {}
    for name, (loss, td) in losses.items():

        def forward_backward(loss: Any = loss, td: TensorDict = td) -> None:
            out = loss(td)
            sum(value for key, value in out.items() if key.startswith("loss")).backward()

        cases[f"loss/{name}/forward"] = (partial(loss, td), None)
        cases[f"loss/{name}/fwd+bwd"] = (forward_backward, loss.zero_grad)
    return cases


def frames(size: int) -> TensorDict:
    """test_rb_sample's and test_rb_populate's data."""
    return TensorDict(
        {"a": torch.zeros(size, 5), ("b", "c"): torch.zeros(size, 3, 32, 32, dtype=torch.uint8)},
        batch_size=[size],
    )


def replay_cases() -> dict[str, Case]:
    """test_rb_sample's and test_rb_populate's RandomSampler cases (tensor and memory-mapped
    storage; populate on tensor storage), and test_rb_extend_sample's eager ones."""
    cases: dict[str, Case] = {}
    for kind, storage in (("tensor", LazyTensorStorage), ("memmap", LazyMemmapStorage)):
        rb = Buffer(storage=storage(10_000), sampler=RandomSampler(), batch_size=256)
        rb.extend(frames(10_000))
        cases[f"replay/sample/{kind}/10000"] = (rb.sample, None)
    empty: list[Any] = []  # the buffer the next call fills, made by the untimed set-up
    few = frames(400)

    def make_empty() -> None:
        empty[:] = [Buffer(storage=LazyTensorStorage(400), sampler=RandomSampler(), batch_size=256)]

    def build_populate() -> None:
        make_empty()
        empty[0].extend(few)

    cases["replay/populate/tensor/400"] = (lambda: empty[0].extend(few), make_empty)
    cases["replay/build_populate/tensor/400"] = (build_populate, None)
    column = torch.randn(10_000, 1)
    for size in (10_000, 100_000, 1_000_000):
        rb = ReplayBuffer(storage=LazyTensorStorage(size), sampler=RandomSampler(), batch_size=3)

        def extend_sample(rb: Any = rb) -> None:
            for _ in range(100):
                rb.extend(column)
                rb.sample()

        cases[f"replay/extend_sample/{size}"] = (extend_sample, None)
    return cases


def torchrl_cases() -> dict[str, Case]:
    """Every case of TorchRL's side, in table order."""
    return {**value_cases(), **loss_cases(), **replay_cases()}
