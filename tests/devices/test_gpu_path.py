"""The GPU path's decisions that need no GPU: CUDA checked before placement counts on it, a
publish's bounded wait for the update, a GPU replay's sampling without a host copy, TF32 and
cuDNN autotuning by default with a setting to turn them off, and the GPU check's compile warm-up.
(tests/devices/test_gpu.py runs them on a GPU.)"""

from __future__ import annotations

import re

import pytest
import torch
from helpers import compose_config
from tensordict import TensorDict

from harness.algos.frame_replay import FrameReplay
from harness.cli.gpu_check import steps
from harness.distributed.placement import Placement, PlacementError, place, use_fast_cuda
from harness.distributed.topology import Layout
from harness.roles.publication import UpdateWaitError, wait_for

pytestmark = pytest.mark.unit


def layout(rank: int, world: int = 3) -> Layout:
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}
    env |= {"LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0"}
    return Layout.from_env(1, env=env)


def placed(rank: int, gpus: int | None = None, trainer_device: str = "auto") -> Placement:
    return place(layout(rank), trainer_device, "auto", "1", "1", False, "gloo", 4, gpus, {})


@pytest.fixture
def one_gpu_counted(monkeypatch):
    """A driver that lists one GPU, as torch.cuda.device_count() reads it."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_a_counted_gpu_cuda_cannot_use_is_one_placement_error_naming_the_problem(one_gpu_counted):
    # This machine has no usable CUDA: the GPU counted above is one CUDA cannot use.
    with pytest.raises(PlacementError) as refused:
        placed(0)
    assert str(refused.value) == (
        "rank 0 trainer: torch counts 1 GPU here, but CUDA cannot use cuda:0 "
        "(torch.cuda.is_available() is False). A broken or mismatched driver, or a device hidden "
        "from this container or job: nvidia-smi shows what the node has. Fix CUDA, or use "
        "trainer.device=cpu"
    )


def test_cudas_own_error_at_the_first_allocation_is_named_in_the_placement_error(
    one_gpu_counted, monkeypatch
):
    # CUDA says it is there, but the allocation fails (here: a torch built without CUDA).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(PlacementError, match=r"CUDA cannot use cuda:0 \(\w+Error: .+\)"):
        placed(0, trainer_device="cuda")


def test_a_cpu_rank_never_touches_cuda_and_a_given_count_is_not_probed(one_gpu_counted):
    assert placed(1).device == "cpu"  # a collector: no CUDA call, so no error
    assert placed(0, gpus=1).device == "cuda:0"  # a count a caller gives (a layout's test)


def test_wait_for_returns_once_the_event_has_happened():
    class Event:
        looks = 0

        def query(self) -> bool:
            self.looks += 1
            return self.looks == 3

    event = Event()
    wait_for(event, 60.0, "the update")
    assert event.looks == 3


def test_wait_for_an_event_that_never_happens_ends_in_a_named_error():
    class Never:
        def query(self) -> bool:
            return False

    with pytest.raises(
        UpdateWaitError,
        match=re.escape("trainer 0's update on cuda:0 had not finished after 0.01 s"),
    ):
        wait_for(Never(), 0.01, "trainer 0's update on cuda:0")


def test_a_replay_not_on_the_cpu_samples_where_it_lives_without_a_host_copy():
    """On ``meta`` (no bytes, not the CPU) a copy to the host raises: the indices stay there."""
    steps_, envs, stack = 4, 2, 3
    rollout = TensorDict(
        obs=torch.randint(0, 255, (steps_, envs, stack, 5, 5), dtype=torch.uint8),
        next_obs=torch.randint(0, 255, (steps_, envs, stack, 5, 5), dtype=torch.uint8),
        action=torch.zeros(steps_, envs, dtype=torch.long),
        batch_size=[steps_, envs],
    )
    replay = FrameReplay(16, rollout, device="meta")
    replay.extend(rollout)
    drawn = replay.sample_index(5)
    assert drawn.device.type == "meta" and drawn.shape == (5,)


def test_a_replay_on_the_cpu_samples_only_live_slots_after_the_ring_wraps():
    steps_, envs, stack = 4, 1, 2
    obs = torch.arange(steps_ * envs * stack * 4, dtype=torch.uint8).reshape(steps_, envs, stack, 4)
    rollout = TensorDict(obs=obs, next_obs=obs + 100, batch_size=[steps_, envs])
    replay = FrameReplay(6, rollout)
    replay.extend(rollout)
    replay.extend(rollout)  # 8 transitions into 6 slots: the two oldest (slots 0, 1) retire
    assert replay.size == 6 and replay.tail == 2
    drawn = replay.sample_index(500, torch.Generator().manual_seed(0))
    assert set(drawn.tolist()) == {2, 3, 4, 5, 0, 1}  # every live slot, the wrap included


@pytest.fixture
def restored_backends():
    saved = (
        torch.get_float32_matmul_precision(),
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
    )
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved[1], saved[2]


def test_fast_cuda_turns_tf32_products_and_cudnn_autotuning_on_and_off(restored_backends):
    use_fast_cuda(True)
    assert torch.get_float32_matmul_precision() == "high"  # TF32 products
    assert torch.backends.cudnn.allow_tf32 and torch.backends.cudnn.benchmark
    use_fast_cuda(False)
    assert torch.get_float32_matmul_precision() == "highest"  # full float32
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cudnn.benchmark


def test_the_layout_line_says_what_a_gpu_trainers_float32_products_run_as():
    on = Placement(0, "trainer", "cuda:0", 1, "trainer.threads")
    off = Placement(0, "trainer", "cuda:0", 1, "trainer.threads", fast_cuda=False)
    assert on.describe() == (
        "rank 0 trainer: cuda:0 (TF32 matmuls, cudnn.benchmark; trainer.fast_cuda=false turns "
        "them off), 1 thread (trainer.threads)"
    )
    assert off.describe() == (
        "rank 0 trainer: cuda:0 (float32 matmuls, no cudnn.benchmark: trainer.fast_cuda=false), "
        "1 thread (trainer.threads)"
    )
    # The CPU and a GPU collector's policy: nothing to say.
    assert Placement(1, "collector", "cuda:1", 1).describe() == "rank 1 collector: cuda:1, 1 thread"
    assert Placement(0, "trainer", "cpu", 2).describe() == "rank 0 trainer: cpu, 2 threads"


def test_fast_cuda_is_on_by_default_and_a_setting_turns_it_off():
    assert compose_config().trainer.fast_cuda is True
    assert compose_config("trainer.fast_cuda=false").trainer.fast_cuda is False


def test_the_check_warms_the_compiled_preset_up_before_its_timed_row(tmp_path, monkeypatch):
    launched: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(
        steps, "launch", lambda c, name, preset, overrides, *_: launched.append((name, overrides))
    )
    steps.runs(steps.Check(tmp_path, dry_run=False))
    names = [name for name, _ in launched]
    warm = names.index("ppo_atari-compile-warm-up")
    assert names[warm + 1] == "ppo_atari-gloo"
    assert "compile-warm-up" not in " ".join(names[:warm] + names[warm + 1 :])  # once, for it alone
    warm_overrides, timed_overrides = launched[warm][1], launched[warm + 1][1]
    frames = re.compile(r"collector\.total_frames=|logger\.")
    # The same launch (the same shapes: what the compiled kernels are specialised to), shorter.
    assert [o for o in warm_overrides if not frames.match(o)] == [
        o for o in timed_overrides if not frames.match(o)
    ]
    assert "collector.total_frames=2048" in warm_overrides
    assert "collector.total_frames=8192" in timed_overrides
