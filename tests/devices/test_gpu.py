"""The GPU tier: what only a GPU can show. Skipped, saying why, without one;
harness gpu-check runs it first on a GPU machine. (The decisions behind
these paths are tested on the CPU in tests/devices/test_devices.py.)"""

from __future__ import annotations

import hashlib

import pytest
import torch
from helpers import pendulum_frames
from tensordict import TensorDict
from test_devices import ON_A_DEVICE, built_on, update_once
from torch import nn

from harness.algos import ALGOS
from harness.algos.devices import check_devices
from harness.algos.gae import gae
from harness.algos.normalize import RewardScaler
from harness.algos.replay import ReplayBuffer
from harness.algos.transfer import HostToDevice
from harness.collect.envs import env_spec
from harness.core import checkpoint
from harness.core.packing import pack_parameters_
from harness.distributed.setup import init_distributed
from harness.distributed.topology import Layout
from harness.rundir.state import Progress, TrainerState
from harness.sync import SCHEMES, Header, make_publisher, make_subscriber
from harness.sync.config import SyncConfig
from harness.sync.payload import DEVICE_TO_HOST, Payload, weights_of
from harness.sync.shared_memory import ShmSink
from harness.testing.spawn import run_ranks

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        GPUS == 0,
        reason="needs CUDA: this machine has no GPU (harness gpu-check runs this tier on one)",
    ),
]
PENDULUM = env_spec("Pendulum-v1")


def model(device: str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 8)).to(device)


def digest(m: nn.Module) -> str:
    return hashlib.sha1(
        b"".join(p.detach().cpu().numpy().tobytes() for p in m.parameters())
    ).hexdigest()


def test_publish_from_a_gpu_is_one_device_to_host_copy_into_pinned_memory_complete_on_return():
    trainer = pack_parameters_(model("cuda"))
    payload = Payload.from_models({"policy": trainer}, pin=True)
    payload.write(weights_of({"policy": trainer}), Header(1))
    assert payload.write_path == DEVICE_TO_HOST and payload.buffer.is_pinned()
    sent, published = (
        payload.buffer.clone(),
        [p.detach().to("cpu", copy=True) for p in trainer.parameters()],
    )
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(1.0)  # the trainer goes on: the bytes already written must not move
    assert torch.equal(payload.buffer, sent)
    assert all(
        torch.equal(a, b)
        for a, b in zip(published, payload.td["weights", "policy"].values(True, True))
    )


def test_a_normalising_gpu_trainer_publishes_policy_and_statistics_with_one_device_to_host_copy():
    sac = ALGOS["sac"]
    algo = sac(sac.Config(normalize_obs=True), PENDULUM, 1000, device="cuda")
    assert algo.obs_norm is not None
    algo.obs_norm.update(torch.randn(32, 3, device="cuda") * 5 + 2)
    models = algo.published_models()
    payload = Payload.from_models(models, pin=True)
    payload.write(weights_of(models), Header(1))
    assert payload.write_path == DEVICE_TO_HOST and payload.buffer.is_pinned()
    sent = payload.td["weights", "obs_norm"]
    assert all(torch.equal(sent[k], v.cpu()) for k, v in algo.obs_norm.state_dict().items())


def test_a_gpu_trainers_shm_segment_is_page_locked_for_cuda():
    sink = ShmSink(0, readers=1)
    sink.open(lambda: Payload.from_models({"policy": pack_parameters_(model("cuda"))}, pin=True))
    try:
        assert (
            sink.segment is not None
            and sink.segment.registered
            and sink.segment.slots[0].is_pinned()
        )
    finally:
        sink.close()


def publish_from_gpu(rank, world, schemes, versions):
    """Trainer 0's model on its GPU publishes back to back, never waiting; CPU collectors check
    every update."""
    groups = init_distributed(
        Layout.from_env(1), 60, SCHEMES["hierarchical"]
    )  # the one of these with a group of its own
    if rank == 0:
        torch.cuda.set_device(0)
    seen = {}
    for scheme in schemes:
        m = pack_parameters_(model("cuda")) if rank == 0 else model()
        end = (
            make_publisher(SyncConfig(name=scheme, timeout_s=30), rank, groups)
            if rank == 0
            else make_subscriber(SyncConfig(name=scheme, timeout_s=30), rank, groups)
        )
        end.connect({"policy": m})
        if rank == 0:
            for v in range(versions):
                with torch.no_grad():
                    for i, p in enumerate(m.parameters()):
                        p.fill_(v + i / 10)
                end.publish(Header(v, stop=v == versions - 1))
            torch.distributed.barrier(groups.sync)  # readers are done with the segment
            end.close()
            continue
        applied, torn, header = 0, 0, end.wait(0)
        while True:
            applied += 1
            torn += not all(
                bool((p == header.version + i / 10).all()) for i, p in enumerate(m.parameters())
            )
            if header.stop:
                break
            header = end.wait(header.version + 1)
        torch.distributed.barrier(groups.sync)
        end.close()
        seen[scheme] = (applied, torn, header.version)
    return seen


def test_gpu_trainer_to_cpu_collectors_every_update_whole_for_gloo_shm_and_hierarchical():
    schemes, versions = ("gloo", "shm", "hierarchical"), 30
    results = run_ranks(publish_from_gpu, 3, schemes, versions, timeout=120)
    assert all(status == "ok" for status, _ in results.values()), results
    for rank in (1, 2):
        seen = results[rank][1]
        for scheme in schemes:
            applied, torn, last = seen[scheme]
            assert torn == 0 and applied >= 1 and last == versions - 1, (
                rank,
                scheme,
                seen,
            )  # every update whole, to the last


def nccl_weights(rank, world):
    torch.cuda.set_device(rank)
    groups = init_distributed(Layout.from_env(1), 60, SCHEMES["nccl"], torch.device("cuda", rank))
    m = pack_parameters_(model(f"cuda:{rank}"))
    end = (
        make_publisher(SyncConfig(name="nccl", timeout_s=30), rank, groups)
        if rank == 0
        else make_subscriber(SyncConfig(name="nccl", timeout_s=30), rank, groups)
    )
    end.connect({"policy": m})
    ok = True
    for version in range(5):
        if rank == 0:
            with torch.no_grad():
                for p in m.parameters():
                    p.fill_(version + 0.25)
            end.publish(Header(version, stop=version == 4))
        else:
            end.wait(version)
            ok &= all(
                bool((p == version + 0.25).all()) and p.device == torch.device("cuda", rank)
                for p in m.parameters()
            )
    end.close()
    return ok


@pytest.mark.skipif(GPUS < 2, reason=f"sync=nccl needs one GPU per rank: {GPUS} GPU here")
def test_nccl_weights_reach_each_collectors_own_gpu_bit_exact():
    world = min(GPUS, 3)
    results = run_ranks(nccl_weights, world, timeout=120)
    assert all(status == "ok" and value is True for status, value in results.values()), results


def test_replay_samples_reach_the_gpu_through_reused_pinned_buffers():
    buffer = ReplayBuffer(
        100, TensorDict(obs=torch.zeros(3), terminated=torch.zeros((), dtype=torch.bool))
    )
    buffer.extend(
        TensorDict(obs=torch.randn(100, 3), terminated=torch.rand(100) < 0.5, batch_size=[100])
    )
    feed = HostToDevice("cuda")
    feed.sample(buffer.storage, buffer.sample_index(16))
    staging = feed.staging
    feed.sample(buffer.storage, buffer.sample_index(16))  # into the other buffer: two take turns
    index = buffer.sample_index(16)
    batch = feed.sample(buffer.storage, index)
    assert feed.staging is staging and staging is not None and staging["obs"].is_pinned()
    assert batch.device.type == "cuda" and torch.equal(
        batch["obs"].cpu(), buffer.storage["obs"][index]
    )


@pytest.mark.parametrize(
    "amp, replay, normalize", [("off", "cpu", False), ("bf16", "trainer", True)]
)
def test_sac_learns_on_the_gpu_with_replay_in_ram_or_on_the_gpu_and_amp(amp, replay, normalize):
    cls = ALGOS["sac"]
    cfg = cls.Config(
        batch_size=32,
        learning_starts=0,
        buffer_size=256,
        amp=amp,
        replay_device=replay,
        normalize_obs=normalize,
    )
    algo = cls(cfg, PENDULUM, 1000, device="cuda")
    metrics = algo.update(pendulum_frames(), 0)
    assert algo.buffer is not None and algo.buffer.storage.device.type == (
        "cuda" if replay == "trainer" else "cpu"
    )
    if normalize:  # statistics of the raw frames, kept on the GPU beside the policy
        assert (
            algo.obs_norm is not None
            and algo.obs_norm.mean.device.type == "cuda"
            and int(algo.obs_norm.count) == 64
        )
    assert all(bool(torch.isfinite(torch.as_tensor(v)).all()) for v in metrics.values())
    assert all(p.device.type == "cuda" for p in algo.critics.parameters())


def test_a_checkpoint_moves_from_cpu_to_gpu_and_back(tmp_path):
    cls = ALGOS["sac"]
    cfg = cls.Config(batch_size=32, learning_starts=0, buffer_size=256)
    cpu = cls(cfg, PENDULUM, 1000)
    cpu.update(pendulum_frames(), 0)
    path = checkpoint.save(
        tmp_path / "a",
        TrainerState(cpu, Progress(), 0, None, True).state_dict(),
        {"step": 1},
        keep=1,
    )
    gpu = cls(cfg, PENDULUM, 1000, device="cuda")
    TrainerState(gpu, Progress(), 0, None, True).load_state_dict(checkpoint.read(path)[0])
    assert all(
        torch.equal(a, b.cpu()) for a, b in zip(cpu.critics.parameters(), gpu.critics.parameters())
    )
    assert all(v.device.type == "cuda" for s in gpu.q_optimizer.state.values() for v in s.values())
    gpu.update(pendulum_frames(), 64)  # it trains on, on the GPU
    back = checkpoint.save(
        tmp_path / "b",
        TrainerState(gpu, Progress(), 0, None, True).state_dict(),
        {"step": 2},
        keep=1,
    )
    again = cls(cfg, PENDULUM, 1000)
    TrainerState(again, Progress(), 0, None, True).load_state_dict(checkpoint.read(back)[0])
    assert all(
        torch.equal(a.cpu(), b)
        for a, b in zip(gpu.critics.parameters(), again.critics.parameters())
    )
    assert again.buffer is not None and again.buffer.storage.device.type == "cpu"


@pytest.mark.parametrize("case", list(ON_A_DEVICE))
def test_every_algorithm_updates_with_all_its_state_on_the_gpu(case):
    """The device tier of tests/devices/test_devices.py on CUDA, fused kernels and all: nothing
    stays on the CPU."""
    algo, spec = built_on("cuda", case)
    update_once(algo, spec)
    assert check_devices(algo).endswith("on cuda:0")


def test_gae_and_the_reward_scaler_give_the_cpus_results_for_gpu_rollouts():
    """Their loops over T run on the CPU for a GPU rollout; what comes back is on the GPU and
    equal."""
    g = torch.Generator().manual_seed(0)
    reward, value = torch.randn(64, 4, generator=g), torch.randn(64, 4, generator=g)
    done, next_value = torch.rand(64, 4, generator=g) < 0.1, torch.randn(4, generator=g)
    on_gpu = gae(*(t.cuda() for t in (reward, value, done, next_value)), 0.99, 0.95)
    assert on_gpu.is_cuda and torch.allclose(
        on_gpu.cpu(), gae(reward, value, done, next_value, 0.99, 0.95)
    )
    here, there = RewardScaler(0.99, 10.0), RewardScaler(0.99, 10.0).cuda()
    for _ in range(2):  # the returns carry across rounds
        scaled = there.scale(reward.cuda(), done.cuda())
        assert scaled.is_cuda and torch.allclose(scaled.cpu(), here.scale(reward, done))
