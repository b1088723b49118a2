"""Where each rank computes: its device and its number of threads.

Decided once at start-up, before any process group exists, from the config
and torchrun's ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE``, and printed in the
layout. Trainers take a GPU when there is one; collectors stay on the CPU
unless the weights arrive by NCCL, which needs one GPU per rank. Threads
(``auto``): a count set in the environment (``OMP_NUM_THREADS``, which
``scripts/*.sh`` and torchrun set to 1 unless it is set, or
``MKL_NUM_THREADS``) wins, as it does for torch itself; else they follow
the cores: each collector keeps one, the node's trainers share the rest.
``trainer.threads=all``: the node's trainers share every core, whatever the
environment says. That fits sync rounds, where the collectors wait while the
trainers learn: ``ppo_atari``'s CNN update on 2 cores ran its job 1.7x faster
than with torchrun's one thread; and jobs a CPU trainer bounds (``dqn_atari``,
1.4x) (docs/pixels.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

import torch

from harness.distributed.topology import Layout

AUTO = "auto"
ALL = "all"  # trainer.threads: every core of the node, shared by its trainers
# what torch's own thread count follows, in this order
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def check_placement(section: str, device: str, threads: str) -> None:
    """A ``trainer`` or ``collector`` section's ``device`` and ``threads``, checked when the config
    loads."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"{section}.device={device!r}: choose auto, cpu or cuda")
    # a collector's envs step on one thread each
    named = (AUTO, ALL) if section == "trainer" else (AUTO,)
    if threads not in named and not (threads.isdigit() and int(threads) >= 1):
        raise ValueError(
            f"{section}.threads={threads!r}: choose {' or '.join(named)} or a "
            "number of threads >= 1"
        )


class PlacementError(ValueError):
    """A device or thread choice that cannot work here, with the fix."""


@dataclass(frozen=True)
class Placement:
    """One rank's device (``cpu`` or ``cuda:<i>``) and intra-op thread count."""

    rank: int
    role: str
    device: str
    threads: int
    threads_from: str = ""  # where the count came from: a setting, the environment, the cores
    fast_cuda: bool = True  # a GPU trainer's TF32 products and cudnn.benchmark (trainer.fast_cuda)

    def describe(self) -> str:
        source = f" ({self.threads_from})" if self.threads_from else ""
        threads = f"{self.threads} thread{'s' * (self.threads != 1)}"
        return f"rank {self.rank} {self.role}: {self.device}{self._kernels()}, {threads}{source}"

    @property
    def trains(self) -> bool:
        """A trainer rank, or the single process that both trains and collects."""
        return self.role.startswith("trainer")

    def _kernels(self) -> str:
        """What a GPU trainer's float32 products run as (nothing on the CPU or a collector)."""
        if not (self.trains and self.device.startswith("cuda")):
            return ""
        if self.fast_cuda:
            return " (TF32 matmuls, cudnn.benchmark; trainer.fast_cuda=false turns them off)"
        return " (float32 matmuls, no cudnn.benchmark: trainer.fast_cuda=false)"

    @property
    def cuda_device(self) -> Optional[torch.device]:
        """This rank's GPU, or None on the CPU."""
        return torch.device(self.device) if self.device.startswith("cuda") else None

    def apply(self) -> None:
        """Bind this process: its GPU (before NCCL sees any), its thread pool."""
        if self.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(self.device))
            if self.trains:
                use_fast_cuda(self.fast_cuda)
        torch.set_num_threads(self.threads)


def use_fast_cuda(on: bool) -> None:
    """TF32 float32 matrix products and convolutions, and cuDNN's autotuning, on or off for this
    process. TF32 keeps float32's range (products' inputs rounded to a 10-bit mantissa, sums in
    float32): on Ampere and later, several times float32's speed for the products of an update.
    cudnn.benchmark times each convolution's algorithms at its first shape: the CNN presets'
    shapes never change."""
    torch.set_float32_matmul_precision("high" if on else "highest")
    torch.backends.cudnn.allow_tf32 = on
    torch.backends.cudnn.benchmark = on


def usable_cores() -> int:
    """Cores this process may run on (affinity: a SLURM allocation, taskset)."""
    return len(os.sched_getaffinity(0))


def _wants_cuda(
    is_trainer: bool, trainer_device: str, collector_device: str, gpu_collectors: bool, gpus: int
) -> bool:
    choice = trainer_device if is_trainer else collector_device
    if choice == AUTO:
        return gpus > 0 if is_trainer else gpu_collectors
    return choice == "cuda"


def check_devices(
    trainer_device: str,
    collector_device: str,
    gpu_collectors: bool,
    scheme: str,
    single_process: bool,
) -> None:
    """The device choices that cannot work together, whichever node a rank is on (every rank finds
    the same)."""
    if single_process:
        return
    if collector_device == "cuda" and not gpu_collectors:
        raise PlacementError(
            f"collector.device=cuda, but sync={scheme} delivers weights to CPU memory and the "
            "policy acts there, so a GPU would only hold a CUDA context (about 0.5 GB) on every "
            "collector. Use collector.device=auto (the CPU) or cpu, or sync=nccl for GPU collectors"
        )
    if gpu_collectors:
        for role, choice in (("collector", collector_device), ("trainer", trainer_device)):
            if choice == "cpu":
                raise PlacementError(
                    f"sync={scheme} moves weights between GPUs, but {role}.device=cpu: use "
                    "sync=shm or sync=gloo for CPU ranks (a GPU trainer stages its "
                    "weights for CPU collectors)"
                )


def place(
    layout: Layout,
    trainer_device: str,
    collector_device: str,
    trainer_threads: str,
    collector_threads: str,
    gpu_collectors: bool,
    scheme: str,
    cores: Optional[int] = None,
    gpus: Optional[int] = None,
    env: Optional[Mapping[str, str]] = None,
    fast_cuda: bool = True,
) -> Placement:
    """This rank's placement. ``*_device``: ``auto``, ``cpu`` or ``cuda``; ``*_threads``: ``auto``,
    a count, or (trainers) ``all``. ``gpu_collectors``: the weight sync scheme (``scheme``, for
    messages) delivers weights to a GPU per collector, so every rank that takes part needs one of
    its own. ``cores``/``gpus``/``env`` (the thread variables) default to this machine's and this
    process's. ``fast_cuda``: ``trainer.fast_cuda``, for a GPU trainer."""
    cores = usable_cores() if cores is None else cores
    counted_here = gpus is None  # this machine's GPUs, not a count a caller gives
    gpus = torch.cuda.device_count() if gpus is None else gpus
    is_trainer = layout.is_trainer
    check_devices(trainer_device, collector_device, gpu_collectors, scheme, layout.single_process)
    # This rank's own role only: a job of GPU trainer nodes and CPU collector nodes is a layout, not
    # a mistake.
    role, choice = ("trainer", trainer_device) if is_trainer else ("collector", collector_device)
    if choice == "cuda" and gpus == 0:
        raise PlacementError(
            f"{role}.device=cuda but this node has no CUDA device: use {role}.device=auto or cpu"
        )
    wants = [
        _wants_cuda(r < layout.trainers, trainer_device, collector_device, gpu_collectors, gpus)
        for r in layout.node_ranks
    ]
    cuda_ranks = [r for r, want in zip(layout.node_ranks, wants) if want]
    device = "cpu"
    if layout.rank in cuda_ranks:
        index = cuda_ranks.index(layout.rank)
        if gpu_collectors and len(cuda_ranks) > gpus:
            raise PlacementError(
                f"sync={scheme} needs one GPU per rank, but node {layout.node_rank} runs "
                f"{len(cuda_ranks)} GPU ranks ({cuda_ranks[0]}..{cuda_ranks[-1]}) on {gpus} "
                f"GPU{'s' * (gpus != 1)}: ranks {cuda_ranks[gpus:]} would share one. Fix: launch "
                f"at most {gpus} ranks per node (--nproc_per_node), or keep collectors on the CPU "
                "with sync=shm or sync=gloo"
            )
        device = f"cuda:{index % gpus}"
        if counted_here:
            check_cuda_works(device, gpus, layout.rank, role)
    threads, threads_from = _threads(
        layout,
        trainer_threads,
        collector_threads,
        cores,
        os.environ if env is None else env,
        gpu_trainer=is_trainer and device.startswith("cuda"),
    )
    return Placement(layout.rank, layout.role, device, threads, threads_from, fast_cuda)


def cuda_problem(device: str) -> Optional[str]:
    """Why CUDA cannot use ``device`` here, or None if it can. ``torch.cuda.device_count()`` counts
    what the driver lists, which can include a GPU that CUDA cannot use (a broken or mismatched
    driver, a device hidden from the container, one busy in exclusive mode): one allocation proves
    it, on the device this rank takes anyway (so it costs no other GPU a context)."""
    try:
        if not torch.cuda.is_available():
            return "torch.cuda.is_available() is False"
        torch.empty(1, device=device)
    except Exception as e:  # CUDA's own error, whatever its class: said once, in the message
        lines = str(e).strip().splitlines()
        return f"{type(e).__name__}: {lines[0] if lines else 'no message'}"
    return None


def check_cuda_works(device: str, gpus: int, rank: int, role: str) -> None:
    """One :class:`PlacementError` naming the problem, before the rank's first real CUDA call (a
    raw CUDA error from deep inside a rank would name none of it)."""
    problem = cuda_problem(device)
    if problem is not None:
        raise PlacementError(
            f"rank {rank} {role}: torch counts {gpus} GPU{'s' * (gpus != 1)} here, but CUDA "
            f"cannot use {device} ({problem}). A broken or mismatched driver, or a device "
            "hidden from this container or job: nvidia-smi shows what the node has. Fix CUDA, "
            f"or use {role}.device=cpu"
        )


def threads_from_env(env: Mapping[str, str]) -> tuple[int, str] | None:
    """The thread count the environment sets (``OMP_NUM_THREADS=4``), and which
    variable set it; None where none does. A value that is not a count is refused."""
    for name in THREAD_VARIABLES:
        value = env.get(name, "").strip()
        if not value:
            continue
        if not value.isdigit() or int(value) < 1:
            raise PlacementError(
                f"{name}={value!r} is not a number of threads >= 1: set a count, or unset it"
            )
        return int(value), name
    return None


def _threads(
    layout: Layout,
    trainer_threads: str,
    collector_threads: str,
    cores: int,
    env: Mapping[str, str],
    gpu_trainer: bool = False,
) -> tuple[int, str]:
    """This rank's thread count and where it came from: its role's setting, if a count or ``all``;
    else (``auto``) the environment's, if it sets one; else the node's cores. A GPU trainer's
    ``all`` is the cores the collectors leave: its products run on the GPU, and every core would
    only take the collectors' (which act while it learns)."""
    section, setting = (
        ("trainer", trainer_threads) if layout.is_trainer else ("collector", collector_threads)
    )
    node_trainers = max(1, sum(r < layout.trainers for r in layout.node_ranks))
    shared = f", shared by {node_trainers} trainers" if node_trainers > 1 else ""
    left = cores - (layout.local_world_size - node_trainers)  # one core per collector of the node
    if setting == ALL and gpu_trainer:
        return max(1, left // node_trainers), (
            f"trainer.threads=all on a GPU: the {max(left, 1)} cores the collectors leave{shared}"
        )
    if setting == ALL:  # a trainer's (checked with the config)
        return max(
            1, cores // node_trainers
        ), f"trainer.threads=all: the node's {cores} cores{shared}"
    if setting != AUTO:
        return int(setting), f"{section}.threads"
    found = threads_from_env(env)
    if found is not None:
        return found[0], f"{found[1]}; {section}.threads=N overrides it"
    if layout.single_process:
        return cores, f"auto: the {cores} cores it may use"
    if layout.is_trainer:
        return max(
            1, left // node_trainers
        ), f"auto: the {max(left, 1)} cores the collectors leave{shared}"
    return 1, "auto: one per collector"


def describe_all(placement: Placement, distributed: bool) -> str:
    """Every rank's placement, one line each (a collective on the default group)."""
    lines = [placement.describe()]
    if distributed:
        lines = [""] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(lines, placement.describe())
    return "\n".join(f"  {line}" for line in lines)
