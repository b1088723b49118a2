"""Each rank's device and thread count, decided from the layout and the config
(the node's GPU and core counts and the thread variables of the environment
are inputs, so every decision is tested here)."""

from __future__ import annotations

import re

import pytest

from harness.distributed.placement import PlacementError, check_placement, place, threads_from_env
from harness.distributed.topology import Layout

pytestmark = pytest.mark.unit


def layout(rank: int, world: int, trainers: int = 1, per_node: int | None = None) -> Layout:
    per_node = per_node or world
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank % per_node),
        "LOCAL_WORLD_SIZE": str(per_node),
        "GROUP_RANK": str(rank // per_node),
    }
    return Layout.from_env(trainers, env=env)


def placements(
    world,
    trainers=1,
    per_node=None,
    trainer_device="auto",
    collector_device="auto",
    trainer_threads="auto",
    collector_threads="auto",
    gpu_collectors=False,
    cores=16,
    gpus=0,
    env=None,
):
    """Every rank's placement; ``env``: the thread variables (none by default)."""
    return [
        place(
            layout(r, world, trainers, per_node),
            trainer_device,
            collector_device,
            trainer_threads,
            collector_threads,
            gpu_collectors,
            "nccl" if gpu_collectors else "gloo",
            cores=cores,
            gpus=gpus,
            env=env or {},
        )
        for r in range(world)
    ]


def test_cpu_node_trainer_takes_the_cores_collectors_leave():
    got = placements(world=9, cores=64)  # 1 trainer + 8 collectors on a 64-core node
    assert [(p.device, p.threads) for p in got] == [("cpu", 56)] + [("cpu", 1)] * 8


def test_two_trainers_share_what_the_collectors_leave_and_never_get_zero():
    got = placements(world=6, trainers=2, cores=16)
    assert [p.threads for p in got] == [6, 6, 1, 1, 1, 1]
    assert placements(world=3, cores=2)[0].threads == 1  # the default job on 2 cores: one each


def test_single_process_uses_every_core_and_explicit_counts_win():
    assert placements(world=1, cores=8)[0].threads == 8
    got = placements(world=3, trainer_threads="4", collector_threads="2", cores=2)
    assert [p.threads for p in got] == [4, 2, 2]


def test_a_thread_count_in_the_environment_wins_over_auto_and_the_layout_says_so():
    """scripts/*.sh export OMP_NUM_THREADS=1 (unless set): one process on 2 shared cores
    took 18.8 s with every core's thread, 5.6 s with one (issue 30, item 12)."""
    one = {"OMP_NUM_THREADS": "1"}
    (single,) = placements(world=1, cores=8, env=one)
    assert single.threads == 1
    assert single.describe() == (
        "rank 0 trainer+collector: cpu, 1 thread (OMP_NUM_THREADS; trainer.threads=N overrides it)"
    )
    assert [p.threads for p in placements(world=9, cores=64, env={"OMP_NUM_THREADS": "4"})] == [
        4
    ] * 9
    assert [p.threads for p in placements(world=3, cores=8, env={"MKL_NUM_THREADS": "2"})] == [
        2
    ] * 3
    # An explicit setting wins over the environment; without either, the cores decide, and the
    # layout says which.
    got = placements(world=3, trainer_threads="4", cores=8, env=one)
    assert [(p.threads, p.threads_from) for p in got] == [
        (4, "trainer.threads"),
        *[(1, "OMP_NUM_THREADS; collector.threads=N overrides it")] * 2,
    ]
    got = placements(world=3, cores=8)
    assert [p.describe() for p in got] == [
        "rank 0 trainer: cpu, 6 threads (auto: the 6 cores the collectors leave)",
        "rank 1 collector: cpu, 1 thread (auto: one per collector)",
        "rank 2 collector: cpu, 1 thread (auto: one per collector)",
    ]
    assert (
        placements(world=1, cores=8)[0]
        .describe()
        .endswith("8 threads (auto: the 8 cores it may use)")
    )


def test_trainer_threads_all_shares_the_node_among_its_trainers_whatever_the_environment_says():
    """Sync rounds: the collectors wait while the trainers learn, so the trainers may take the whole
    node."""
    one = {"OMP_NUM_THREADS": "1"}
    got = placements(world=3, trainer_threads="all", cores=2, env=one)
    assert [p.threads for p in got] == [2, 1, 1]
    assert (
        got[0].describe()
        == "rank 0 trainer: cpu, 2 threads (trainer.threads=all: the node's 2 cores)"
    )
    two_nodes = placements(
        world=8, trainers=2, per_node=4, trainer_threads="all", cores=16, env=one
    )
    assert [p.threads for p in two_nodes] == [
        8,
        8,
        1,
        1,
        1,
        1,
        1,
        1,
    ]  # node 0: 2 trainers share 16 cores
    assert (
        two_nodes[0]
        .describe()
        .endswith("8 threads (trainer.threads=all: the node's 16 cores, shared by 2 trainers)")
    )


def test_all_threads_is_a_trainers_choice_only():
    with pytest.raises(
        ValueError, match=r"collector.threads='all': choose auto or a number of threads >= 1"
    ):
        check_placement("collector", "auto", "all")
    with pytest.raises(
        ValueError, match=r"trainer.threads='many': choose auto or all or a number of threads >= 1"
    ):
        check_placement("trainer", "auto", "many")


def test_a_thread_variable_that_is_not_a_count_is_refused_naming_it():
    for value in ("abc", "0", "-2"):
        with pytest.raises(
            PlacementError,
            match=re.escape(f"OMP_NUM_THREADS={value!r} is not a number of threads >= 1"),
        ):
            placements(world=1, env={"OMP_NUM_THREADS": value})
    assert threads_from_env({"OMP_NUM_THREADS": " ", "MKL_NUM_THREADS": "3"}) == (
        3,
        "MKL_NUM_THREADS",
    )  # blank: unset
    assert threads_from_env({}) is None


def test_gpu_trainer_with_cpu_collectors():
    got = placements(world=4, gpus=1)
    assert [p.device for p in got] == ["cuda:0", "cpu", "cpu", "cpu"]


def test_nccl_puts_every_rank_on_its_own_gpu_by_local_rank():
    got = placements(world=8, per_node=4, gpu_collectors=True, gpus=4)  # two nodes of 4 GPUs
    assert [p.device for p in got] == [f"cuda:{i}" for i in range(4)] * 2


def test_two_ranks_on_one_gpu_with_nccl_fail_naming_the_ranks_and_the_fix():
    with pytest.raises(
        PlacementError, match=r"ranks \[2\] would share one.*--nproc_per_node.*sync=shm"
    ):
        placements(world=3, gpu_collectors=True, gpus=2)


def test_cuda_asked_for_without_a_gpu_and_nccl_with_cpu_collectors_are_refused():
    with pytest.raises(
        PlacementError, match=re.escape("trainer.device=cuda but this node has no CUDA device")
    ):
        placements(world=3, trainer_device="cuda", gpus=0)
    with pytest.raises(PlacementError, match=r"sync=nccl .* collector.device=cpu"):
        placements(world=3, collector_device="cpu", gpu_collectors=True, gpus=4)


def test_gpu_trainers_of_a_node_take_gpus_in_local_rank_order():
    got = placements(world=6, trainers=2, gpus=2)
    assert [p.device for p in got] == ["cuda:0", "cuda:1", "cpu", "cpu", "cpu", "cpu"]


def test_nccl_with_a_cpu_trainer_is_refused_naming_the_fix():
    with pytest.raises(
        PlacementError, match=r"sync=nccl .* trainer.device=cpu: use sync=shm or sync=gloo"
    ):
        placements(world=3, trainer_device="cpu", gpu_collectors=True, gpus=4)


def test_each_rank_takes_the_gpu_of_its_local_rank_on_its_own_node():
    """Ranks 4..7 of a second node count their GPUs from 0 again: LOCAL_RANK, not the global
    rank."""
    got = [
        place(
            layout(r, 8, per_node=4),
            "auto",
            "auto",
            "auto",
            "auto",
            gpu_collectors=True,
            scheme="nccl",
            cores=16,
            gpus=4,
        )
        for r in (4, 6)
    ]
    assert [p.device for p in got] == ["cuda:0", "cuda:2"]
    assert got[0].cuda_device is not None and got[0].cuda_device.index == 0
    assert placements(world=2)[1].cuda_device is None  # a CPU rank binds no GPU


def test_single_process_debug_run_takes_the_gpu_and_ignores_nccl_rules():
    got = placements(world=1, gpu_collectors=True, gpus=1)
    assert [p.device for p in got] == ["cuda:0"]


def test_a_gpu_trainer_node_with_cpu_collector_nodes_is_a_layout_not_a_mistake():
    """trainer.device=cuda is refused only on a rank that trains: collector nodes need no GPU."""
    trainer_node = place(
        layout(0, 4, per_node=2),
        "cuda",
        "auto",
        "auto",
        "auto",
        gpu_collectors=False,
        scheme="gloo",
        cores=16,
        gpus=1,
    )
    collector_node = [
        place(
            layout(r, 4, per_node=2),
            "cuda",
            "auto",
            "auto",
            "auto",
            gpu_collectors=False,
            scheme="gloo",
            cores=16,
            gpus=0,
        )
        for r in (2, 3)
    ]
    assert trainer_node.device == "cuda:0" and [p.device for p in collector_node] == ["cpu", "cpu"]
    with pytest.raises(
        PlacementError, match=re.escape("trainer.device=cuda but this node has no CUDA device")
    ):
        place(
            layout(0, 4, per_node=2),
            "cuda",
            "auto",
            "auto",
            "auto",
            gpu_collectors=False,
            scheme="gloo",
            cores=16,
            gpus=0,
        )


@pytest.mark.parametrize("gpus", [0, 4])
def test_gpu_collectors_without_nccl_are_refused_saying_why(gpus):
    """With gloo, shm or hierarchical the weights arrive in CPU memory: a GPU collector would act on
    the CPU."""
    with pytest.raises(
        PlacementError,
        match=(
            r"collector.device=cuda, but sync=gloo delivers weights to CPU "
            r"memory.*collector.device=auto"
        ),
    ):
        placements(world=3, collector_device="cuda", gpus=gpus)
    assert (
        placements(world=1, collector_device="cuda", gpus=1)[0].device == "cuda:0"
    )  # one process: the trainer's device


def test_a_gpu_trainers_all_threads_are_the_cores_its_collectors_leave():
    """Its products run on the GPU: every core would only take the collectors'."""
    got = placements(world=4, trainer_device="cuda", trainer_threads="all", cores=16, gpus=1)
    assert got[0].threads == 13 and got[0].device == "cuda:0"
    assert "all on a GPU: the 13 cores the collectors leave" in got[0].describe()
    assert [p.threads for p in got[1:]] == [1, 1, 1]
    cpu = placements(world=4, trainer_device="cpu", trainer_threads="all", cores=16)
    assert cpu[0].threads == 16  # a CPU trainer's all: the node's cores, as before
