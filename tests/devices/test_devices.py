"""Device decisions that need no GPU: how weights leave a trainer, how batches
reach it, checkpoints across devices, and mixed precision. (What only a GPU
can show is in tests/devices/test_gpu.py.)"""

from __future__ import annotations

import contextlib

import pytest
import torch
from helpers import pendulum_frames
from tensordict import TensorDict
from torch import nn

from harness.algos import ALGOS, algorithm_for
from harness.algos.devices import check_devices, misplaced
from harness.algos.replay import ReplayBuffer
from harness.algos.transfer import HostToDevice
from harness.collect.envs import env_spec
from harness.core import checkpoint
from harness.core.packing import flat_region, pack, pack_parameters_
from harness.core.specs import EnvSpec
from harness.rundir.state import Progress, TrainerState
from harness.sync.nccl import watchdog_s
from harness.sync.payload import (
    DEVICE_TO_HOST,
    PLAIN_COPY,
    Header,
    Payload,
    staging_path,
    weights_of,
)

pytestmark = pytest.mark.unit
PENDULUM = env_spec("Pendulum-v1")
CUDA, CPU, META = torch.device("cuda:0"), torch.device("cpu"), torch.device("meta")


def test_staging_path_is_a_device_to_host_copy_only_from_a_gpu_into_cpu_memory():
    assert staging_path(CUDA, CPU) == DEVICE_TO_HOST  # GPU trainer, CPU collectors: pinned + event
    assert staging_path(CPU, CPU) == PLAIN_COPY  # the CPU path: one copy, as before
    assert (
        staging_path(CUDA, torch.device("cuda:0")) == PLAIN_COPY
    )  # sync=nccl: on the GPU, stream-ordered


def test_cpu_publish_is_one_flat_copy_with_no_event_and_lands_whole():
    trainer = pack_parameters_(nn.Sequential(nn.Linear(3, 8), nn.Linear(8, 2)))
    payload = Payload.from_models({"policy": trainer})
    assert not payload.buffer.is_pinned()  # a CPU trainer's payload is plain memory
    weights = weights_of({"policy": trainer})
    payload.write(weights, Header(3))
    assert payload.write_path == PLAIN_COPY  # one flat copy, no staging, no event
    assert all(
        torch.equal(a, b)
        for a, b in zip(trainer.parameters(), payload.td["weights", "policy"].values(True, True))
    )


def test_a_normalising_algorithms_policy_and_statistics_publish_as_one_flat_copy():
    """Policy (float32) and observation statistics (float64) share the trainer's one packed buffer,
    so a publish moves both with one copy: on a GPU trainer, the one device-to-host copy."""
    sac = ALGOS["sac"]
    algo = sac(sac.Config(normalize_obs=True), PENDULUM, 1000)
    assert algo.obs_norm is not None
    algo.obs_norm.update(torch.randn(32, 3) * 5 + 2)
    models = algo.published_models()
    payload = Payload.from_models(models)
    payload.write(weights_of(models), Header(1))
    assert list(models) == ["policy", "obs_norm"] and payload.write_path == PLAIN_COPY
    sent = payload.td["weights", "obs_norm"]
    assert sent["mean"].dtype == torch.float64 and int(sent["count"]) == 32
    assert all(torch.equal(sent[k], v) for k, v in algo.obs_norm.state_dict().items())


def test_flat_region_refuses_a_target_whose_leaves_are_not_one_buffer():
    source = pack_parameters_(nn.Linear(3, 2))
    loose = TensorDict.from_module(nn.Linear(3, 2)).detach()  # two separate tensors
    assert flat_region(TensorDict.from_module(source), loose) is None
    assert (
        flat_region(
            TensorDict.from_module(source),
            TensorDict.from_module(pack_parameters_(nn.Linear(3, 2))),
        )
        is not None
    )


def replay(n: int = 50) -> ReplayBuffer:
    buffer = ReplayBuffer(
        64,
        TensorDict(
            obs=torch.zeros(3), action=torch.zeros(1), terminated=torch.zeros((), dtype=torch.bool)
        ),
    )
    data = TensorDict(
        obs=torch.arange(3 * n, dtype=torch.float32).view(n, 3),
        action=torch.arange(n, dtype=torch.float32)[:, None],
        terminated=torch.arange(n) % 2 == 0,
        batch_size=[n],
    )
    buffer.extend(data)
    return buffer


def test_a_cpu_trainer_indexes_its_replay_in_place_with_nothing_staged():
    buffer, feed = replay(), HostToDevice("cpu")
    index = torch.tensor([3, 7, 7])
    batch = feed.sample(buffer.storage, index)
    assert torch.equal(batch["obs"], buffer.storage["obs"][index]) and feed.staging is None
    same = TensorDict(x=torch.ones(2), batch_size=[2])
    assert feed.move(same) is same


def test_a_device_trainer_gathers_into_two_staging_buffers_in_turn_then_moves_them():
    """Towards ``meta`` (no bytes move) the staging steps run here as on a GPU, without pinning or
    events. Two buffers take turns, so the CPU fills one while the other's copy is still queued."""
    buffer, feed = replay(), HostToDevice(META)
    first = feed.sample(buffer.storage, torch.tensor([1, 2, 3, 4]))
    assert first.device == META and first["obs"].shape == (4, 3)
    staging = feed.staging
    assert staging is not None and staging.is_consolidated()  # one storage: one copy to the device
    feed.sample(buffer.storage, torch.tensor([0, 0, 0, 0]))
    other = feed.staging
    assert other is not None and other is not staging  # the second batch in the other buffer
    index = torch.tensor([9, 0, 9, 5])
    feed.sample(buffer.storage, index)
    assert feed.staging is staging  # the third in the first again: reused, not reallocated
    for key in ("obs", "action", "terminated"):
        assert torch.equal(staging[key], buffer.storage[key][index]), (
            key
        )  # gathered straight into it
    assert torch.equal(
        other["obs"], buffer.storage["obs"][torch.tensor([0, 0, 0, 0])]
    )  # the other left as it was
    for _ in range(
        4
    ):  # PPO's rounds: the first two make buffers of their layout, the next reuse them
        rounds = TensorDict(
            rollout=TensorDict(obs=torch.randn(4, 2, 3), batch_size=[4, 2]),
            next_obs=torch.randn(2, 3),
        )
        moved = feed.move(rounds)
        assert moved.device == META and torch.equal(
            feed.staging["rollout", "obs"], rounds["rollout", "obs"]
        )
    assert (
        feed.staging is not staging and feed.staging is not other and feed.staging.is_consolidated()
    )


def test_replay_made_on_a_device_and_rebuilt_from_a_checkpoint_on_another():
    state = replay(10).state_dict()
    rebuilt = ReplayBuffer.from_state(state, 64, device=META)
    assert rebuilt.storage.device == META and rebuilt.size == 10
    assert rebuilt.sample_index(4).device == META


@contextlib.contextmanager
def saved_as_if_on_a_gpu():
    """``torch.save`` tags every storage with the device it was on, and that tag
    is all a file knows of devices: tag CPU storages ``cuda:0`` while saving,
    and the file is the one a GPU trainer writes."""
    registry = torch.serialization._package_registry
    entry = (
        1,
        lambda storage: "cuda:0" if storage.device.type == "cpu" else None,
        lambda storage, location: None,
    )
    registry.insert(0, entry)
    try:
        yield
    finally:
        registry.remove(entry)


def test_a_checkpoint_written_on_a_gpu_resumes_on_a_cpu(tmp_path):
    algo_cls = ALGOS["sac"]
    cfg = algo_cls.Config(batch_size=16, learning_starts=0, buffer_size=64)
    torch.manual_seed(0)
    trained = algo_cls(cfg, PENDULUM, 1000)
    n = 32
    trained.update(pendulum_frames(n), 0)  # steps taken: Adam has state
    state = TrainerState(trained, Progress(frames=n), 0, None, keep_replay=True).state_dict()
    with saved_as_if_on_a_gpu():
        path = checkpoint.save(
            tmp_path, state, {"step": n, "algo": "sac", "env": "Pendulum-v1"}, keep=1
        )
    if not torch.cuda.is_available():
        with pytest.raises(
            RuntimeError, match="CUDA"
        ):  # the file asks for a GPU: loading it as saved needs one
            torch.load(path / "state.pt", weights_only=True)
    loaded, _ = checkpoint.read(path)
    resumed = algo_cls(cfg, PENDULUM, 1000)
    TrainerState(resumed, Progress(), 0, None, keep_replay=True).load_state_dict(loaded)
    for a, b in zip(trained.critics.parameters(), resumed.critics.parameters()):
        assert b.device == CPU and torch.equal(a, b)
    for mine, theirs in zip(resumed.q_optimizer.state.values(), trained.q_optimizer.state.values()):
        assert all(v.device == CPU and torch.equal(v, theirs[k]) for k, v in mine.items())
    assert (
        resumed.buffer is not None
        and resumed.buffer.size == n
        and resumed.buffer.storage.device == CPU
    )
    resumed.update(pendulum_frames(n), n)  # and it trains on


def test_amp_is_off_unless_asked_and_names_its_choices():
    sac = ALGOS["sac"]
    assert sac(sac.Config(), PENDULUM, 1000).amp_dtype is None
    assert sac(sac.Config(amp="bf16"), PENDULUM, 1000).amp_dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"algo.amp='fp16': choose off .* or bf16"):
        sac.Config(amp="fp16")


def values_under_test(name: str, algo, obs: torch.Tensor) -> torch.Tensor:
    """What the algorithm's TD or value loss regresses: Q (or V) on ``obs``."""
    if name == "dqn":
        return algo.policy.q(obs)
    if name == "ppo":
        return algo.loss.value(obs)
    action = torch.rand(obs.shape[0], 1)
    if name == "iql":
        return algo.value_loss(obs, action)[1]  # Q - V
    return algo.critics(obs, action)


@pytest.mark.parametrize("name", ["sac", "td3", "iql", "dqn", "ppo"])
def test_amp_multiplies_in_bfloat16_but_the_values_losses_regress_stay_float32(name):
    """bfloat16 keeps 8 bits of mantissa: a Q-value near -1000 would move in steps of 4,
    swallowing the TD error. The heads return float32 whatever autocast computed inside."""
    spec = env_spec("CartPole-v1") if name in ("dqn", "ppo") else PENDULUM
    cls = ALGOS[name]
    algo = cls(cls.Config(amp="bf16"), spec, 1000)
    obs = torch.randn(8, spec.obs_dim)
    with algo.autocast():
        assert torch.mm(obs, obs.T).dtype == torch.bfloat16  # the products inside are bfloat16
        assert values_under_test(name, algo, obs).dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in algo.policy.parameters())


@pytest.mark.parametrize(
    "name, env",
    [
        ("sac", "Pendulum-v1"),
        ("td3", "Pendulum-v1"),
        ("dqn", "CartPole-v1"),
        ("iql", "Pendulum-v1"),
        ("cql", "CartPole-v1"),
        ("ppo", "CartPole-v1"),
        ("ppo", "Pendulum-v1"),
    ],
)
def test_every_policy_acts_on_the_device_its_weights_are_on(name, env):
    """A GPU collector (sync=nccl) acts with weights on its GPU: exploration noise and random
    actions must be drawn there too. ``meta`` stands in for the GPU: it refuses to mix devices just
    as CUDA does."""
    spec = env_spec(env)
    cls = algorithm_for(name, spec)
    policy = cls.make_policy(cls.Config(), spec).to(META)
    for values in ({}, {"random": 1.0, "epsilon": 0.5}):
        assert policy(torch.zeros(4, spec.obs_dim, device=META), values)["action"].device == META


def test_a_normalising_policy_acts_on_the_device_its_weights_and_statistics_are_on():
    """A GPU collector of a normalising algorithm: the statistics it normalises with are on its GPU
    too."""
    cls = ALGOS["ppo"]
    models = {
        name: m.to(META)
        for name, m in cls.make_models(cls.Config(normalize_obs=True), PENDULUM).items()
    }
    policy = cls.acting_policy(models)
    assert policy(torch.zeros(4, PENDULUM.obs_dim, device=META))["action"].device == META


# The device tier: every algorithm built, fed, updated and resumed on ``meta``, a device other than
# the CPU's default, so that a tensor made or left on the CPU shows here as it would on a GPU.
# ``meta`` holds no bytes, and it does not refuse every mix (F.linear of a meta input with CPU
# weights returns meta): ``check_devices`` reads where every tensor is. What meta cannot run, and
# how that path is covered: fused Adam has no meta kernel (``optim.adam`` takes the plain one there;
# fused Adam runs in every CPU test), nor does the foreach gradient-norm clip (PPO uses the
# per-tensor one there), nor autocast (``algo.amp`` is measured by tests/devices/test_gpu.py and the
# GPU check), nor torch.compile (compile=False here).
def observations(spec, *batch: int) -> torch.Tensor:
    """Random observations as collectors send them: images as uint8 ``[..., C, H, W]``, state
    vectors as float32."""
    if spec.pixels:
        return torch.randint(0, 256, (*batch, *spec.obs_shape), dtype=torch.uint8)
    return torch.randn(*batch, spec.obs_dim)


def frames_for(spec, n: int = 64) -> list[TensorDict]:
    """One collector's batch of ``n`` random transitions (``spec``'s shapes), as ``update`` takes
    it."""
    if not spec.discrete:
        return pendulum_frames(n)
    data = TensorDict(
        obs=observations(spec, n),
        action=torch.randint(0, spec.num_actions, (n,)),
        reward=torch.randn(n),
        next_obs=observations(spec, n),
        terminated=torch.zeros(n, dtype=torch.bool),
        batch_size=[n],
    )
    return [TensorDict(rollout=data.unsqueeze(1), batch_size=[])]


def ppo_round(spec, steps: int = 16, envs: int = 2) -> list[TensorDict]:
    """One collector's sync round for PPO: ``[steps, envs]`` frames and the observation after
    them."""
    action = (
        torch.randint(0, spec.num_actions, (steps, envs))
        if spec.discrete
        else torch.randn(steps, envs, spec.num_actions)
    )
    rollout = TensorDict(
        obs=observations(spec, steps, envs),
        action=action,
        logprob=torch.randn(steps, envs),
        reward=torch.randn(steps, envs),
        done=torch.rand(steps, envs) < 0.1,
        terminated=torch.rand(steps, envs) < 0.1,
        batch_size=[steps, envs],
    )
    if spec.pixels:  # the value head's, recorded while acting
        rollout["value"] = torch.randn(steps, envs)
    return [TensorDict(rollout=rollout, next_obs=observations(spec, envs))]


CARTPOLE = env_spec("CartPole-v1")
ATARI = EnvSpec((4, 84, 84), True, (), 4, obs_dtype="uint8")  # as harness/Atari-Breakout-v5 reads
# Each with the options that write into its batches (normalised observations, scaled rewards).
ON_A_DEVICE = {
    "ppo": (CARTPOLE, {}),
    "ppo-vtrace": (CARTPOLE, {"vtrace": True}),
    "ppo-atari": (ATARI, {}),  # the Nature CNN on uint8 stacks
    "ppo-continuous": (PENDULUM, {"normalize_obs": True, "normalize_reward": True}),
    "sac": (PENDULUM, {"normalize_obs": True, "batch_size": 8, "learning_starts": 0}),
    "td3": (PENDULUM, {"normalize_obs": True, "batch_size": 8, "learning_starts": 0}),
    "dqn": (CARTPOLE, {"batch_size": 8, "learning_starts": 0}),
    "iql": (PENDULUM, {"normalize_obs": True, "reward_scale": 0.5, "batch_size": 8}),
    "cql": (PENDULUM, {"normalize_obs": True, "reward_scale": 0.5, "batch_size": 8}),
    "cql-discrete": (CARTPOLE, {"reward_scale": 0.5, "batch_size": 8}),
    "cql-discrete-atari": (
        ATARI,
        {"batch_size": 8},
    ),  # an image dataset's uint8 stacks through the Nature CNN
    "dqn-atari": (ATARI, {"batch_size": 8, "learning_starts": 0}),
    "dqn-atari-frames": (
        ATARI,
        {"batch_size": 8, "learning_starts": 0, "replay_frames": True},
    ),  # frame replay
}


def built_on(device, case: str):
    spec, options = ON_A_DEVICE[case]
    cls = algorithm_for(case.split("-")[0], spec)
    return cls(cls.Config(compile=False, **options), spec, 10_000, device=device), spec


def update_once(algo, spec) -> dict:
    if algo.offline:
        algo.use_dataset(frames_for(spec)[0]["rollout"].reshape(-1))
        return algo.update([], 0)
    return algo.update(ppo_round(spec) if algo.cfg.name == "ppo" else frames_for(spec), 0)


@pytest.mark.parametrize("case", list(ON_A_DEVICE))
@pytest.mark.filterwarnings(
    "ignore:.*copying from a non-meta parameter"
)  # a resume onto meta copies no bytes, as it says
def test_every_algorithm_builds_updates_and_resumes_with_all_its_state_on_its_device(case):
    algo, spec = built_on(META, case)
    assert check_devices(algo).endswith("on meta")  # construction and packing: nothing on the CPU
    metrics = update_once(
        algo, spec
    )  # HostToDevice's batch, normalised and scaled in place, one update
    assert all(v.device == META for v in metrics.values() if isinstance(v, torch.Tensor)), metrics
    assert misplaced(algo) == []  # optimiser states made by the update, the replay where it belongs
    trained_here, _ = built_on(CPU, case)  # a checkpoint written elsewhere, resumed on the device
    update_once(trained_here, spec)
    algo.load_state_dict(trained_here.state_dict())
    assert misplaced(algo) == []


def test_the_device_check_names_every_tensor_left_behind():
    algo, spec = built_on(META, "sac")
    update_once(algo, spec)
    algo.log_alpha.to_empty(
        device=CPU
    )  # a module moved back, as a forgotten .to(device) would leave it
    with pytest.raises(
        RuntimeError,
        match=r"should live on meta, but 1 tensors do not: log_alpha\.log_value \(cpu\)",
    ):
        check_devices(algo)


def test_a_batch_moved_to_a_device_can_be_written_into_as_on_the_cpu():
    """``consolidate`` locks what it makes, and so is a consolidated TensorDict moved to a device:
    the update's batch must take normalised observations and scaled rewards (it is the update's own
    copy)."""
    feed = HostToDevice(META)
    for batch in (
        feed.sample(replay().storage, torch.tensor([1, 2])),
        feed.move(TensorDict(obs=torch.zeros(2, 3), batch_size=[2])),
    ):
        assert batch.device == META and not batch.is_locked
        batch["obs"] = batch["obs"] * 2


def test_pack_keeps_the_leaves_on_their_device_and_refuses_a_mix():
    packed = pack_parameters_(nn.Linear(3, 2).to(META))
    assert packed.weight.device == META and packed.bias.device == META
    mixed = TensorDict(a=torch.zeros(2), b=torch.zeros(2, device=META))
    with pytest.raises(ValueError, match=r"one device; these are on \['cpu', 'meta'\]"):
        pack(mixed)


def test_nccls_watchdog_outlasts_the_harness_own_waits_so_their_named_error_comes_first():
    for wait_s in (1.0, 60.0, 600.0):
        assert watchdog_s(wait_s) >= 2 * wait_s and watchdog_s(wait_s) - wait_s >= 60
