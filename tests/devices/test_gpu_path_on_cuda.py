"""The GPU path's fixes on a real GPU (tier gpu; tests/devices/test_gpu_path.py has their CPU
halves): CUDA proved before placement counts on it, TF32 and cuDNN autotuning applied to a GPU
trainer, a publish that waits for the update's own stream with a bound, and a GPU replay that
samples without a device sync."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from harness.algos.frame_replay import FrameReplay
from harness.distributed.placement import Placement, place
from harness.distributed.topology import Layout
from harness.roles.publication import Publication, UpdateWaitError, wait_for_update
from harness.rundir.state import Progress

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs CUDA: this machine has no GPU (harness gpu-check runs this tier on one)",
    ),
]


def test_a_working_gpu_passes_the_placement_probe_and_its_trainer_gets_tf32():
    env = {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "3"}
    rank_0 = Layout.from_env(1, env={**env, "GROUP_RANK": "0"})
    placement = place(rank_0, "auto", "auto", "1", "1", False, "gloo", 4, None, {})
    assert placement.device == "cuda:0"
    saved = torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark
    threads, cudnn_tf32 = torch.get_num_threads(), torch.backends.cudnn.allow_tf32
    try:
        placement.apply()
        assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.benchmark
        Placement(0, "trainer", "cuda:0", 1, fast_cuda=False).apply()
        assert torch.get_float32_matmul_precision() == "highest"
        assert not torch.backends.cudnn.benchmark
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = saved[1], cudnn_tf32
        torch.set_num_threads(threads)


def test_the_update_wait_is_bounded_and_names_what_it_waited_for():
    torch.cuda._sleep(5_000_000_000)  # a kernel of seconds: the "update" still running
    with pytest.raises(UpdateWaitError, match=r"update on cuda:0 had not finished after 0.05 s"):
        wait_for_update(torch.device("cuda:0"), 0.05)
    torch.cuda.synchronize()


def test_a_publish_waits_for_the_updates_stream_not_the_whole_device(monkeypatch):
    class Algo:
        device = torch.device("cuda:0")

        def values_for_header(self, frames: int) -> dict[str, float]:
            return {}

    class Publisher:
        def __init__(self):
            self.stream_done_at_send: list[bool] = []

        def publish(self, header) -> None:
            self.stream_done_at_send.append(torch.cuda.current_stream().query())

    def refuse(*args, **kwargs):
        raise AssertionError("a device-wide synchronize before a publish")

    monkeypatch.setattr(torch.cuda, "synchronize", refuse)
    torch.cuda._sleep(200_000_000)  # the update's kernels, still queued when the publish starts
    publisher = Publisher()
    Publication(publisher, Progress(), Algo(), 60.0).publish()  # type: ignore[arg-type]
    assert publisher.stream_done_at_send == [True]  # waited for the update, by its stream


def test_a_replay_on_the_gpu_samples_with_no_device_sync():
    steps, envs, stack = 8, 2, 4
    rollout = TensorDict(
        obs=torch.randint(0, 255, (steps, envs, stack, 84, 84), dtype=torch.uint8),
        next_obs=torch.randint(0, 255, (steps, envs, stack, 84, 84), dtype=torch.uint8),
        action=torch.zeros(steps, envs, dtype=torch.long),
        batch_size=[steps, envs],
    )
    replay = FrameReplay(64, rollout, device="cuda")
    replay.extend(rollout)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a host copy of the indices would raise here
    try:
        drawn = replay.sample_index(32)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert drawn.is_cuda and drawn.shape == (32,)
    assert replay.gather(drawn)["obs"].shape == (32, stack, 84, 84)
