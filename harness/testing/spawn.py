"""Spawn a job's ranks as local processes (tests and benchmarks).

Each rank gets torchrun's environment variables (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``PORT``, ``GROUP_RANK``) and runs a picklable function; its
result or exception comes back to the parent. Ranks can claim different node
ranks, which is how one machine stands in for several nodes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import socket
import time
import traceback

STARTED = "started"
# Starting a rank imports the target's module before the target runs: seconds
# on a quiet machine, minutes on a loaded one. That is not a hang.
START_TIMEOUT_S = 600.0
# Ranks fork from one server process that imported these once, rather than each
# importing torch afresh (2-3 s of CPU a rank; a test suite starts hundreds).
# Nothing has run in the server, so no thread pool or process group is forked.
PRELOAD = [
    "torch",
    "torch.distributed",
    "tensordict",
    "gymnasium",
    "harness.sync",
    "harness.collect.envs",
]


def context() -> mp.context.ForkServerContext:
    ctx = mp.get_context("forkserver")  # type: ignore[assignment]
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(target, rank, world_size, port, queue, args, nodes):
    node = nodes[rank]
    local = [r for r in range(world_size) if nodes[r] == node]
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(local.index(rank)),
        LOCAL_WORLD_SIZE=str(len(local)),
        GROUP_RANK=str(node),
        OMP_NUM_THREADS="1",
    )
    import torch

    # torch was imported (by the fork server) before OMP_NUM_THREADS was set here
    torch.set_num_threads(1)
    queue.put((rank, STARTED, None))  # imports done: from here on ``timeout`` counts
    try:
        queue.put((rank, "ok", target(rank, world_size, *args)))
    except BaseException as e:  # report every failure to the parent, typed by name
        queue.put((rank, type(e).__name__, f"{e}\n{traceback.format_exc()}"))


def run_ranks(
    target, world_size: int, *args, ranks=None, nodes=None, timeout: float = 60.0
) -> dict[int, tuple[str, object]]:
    """Run ``target(rank, world_size, *args)`` in one spawned process per rank
    (``ranks`` defaults to all) and return ``{rank: (status, result)}`` where
    status is ``"ok"`` or the exception's class name. A rank whose target runs
    past ``timeout`` (counted from when it started, after its imports) is
    killed and reported as ``"hung"``. ``nodes[rank]`` is the node rank a rank
    reports (torchrun's GROUP_RANK), to simulate several nodes (list a node's
    ranks contiguously, as torchrun numbers them)."""
    ctx = context()
    queue, port = ctx.Queue(), free_port()
    ranks = list(range(world_size)) if ranks is None else ranks
    nodes = nodes or [0] * world_size
    procs = {
        r: ctx.Process(target=_rank_main, args=(target, r, world_size, port, queue, args, nodes))
        for r in ranks
    }
    for p in procs.values():
        p.start()
    results: dict[int, tuple[str, object]] = {}
    spawned = time.monotonic()
    deadlines = {r: spawned + START_TIMEOUT_S for r in ranks}
    while len(results) < len(ranks) and time.monotonic() < max(
        deadlines[r] for r in ranks if r not in results
    ):
        try:
            rank, status, value = queue.get(timeout=0.5)
        except queue_mod.Empty:
            if all(not p.is_alive() for p in procs.values()) and queue.empty():
                break
            continue
        if status == STARTED:
            deadlines[rank] = time.monotonic() + timeout
        else:
            results[rank] = (status, value)
    for r, p in procs.items():
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()
        results.setdefault(r, ("hung", None) if p.exitcode in (None, -9) else ("died", p.exitcode))
    return results
