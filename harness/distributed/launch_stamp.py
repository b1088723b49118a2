"""The launch's stamp: one name for one launch, the same on every rank and after a restart.

Default run directories and a sweep's directory are named by it, so every rank
of a launch must read the same stamp, and a restarted attempt (torchrun
``--max-restarts``, a SLURM requeue) must read its launch's stamp again to find
its own run directory and resume there. Each rank's own clock gives neither
(three ranks started across a second boundary made two sweep directories).

In order:

1. ``HARNESS_LAUNCH_STAMP``, if set: the caller names the launch.
2. Under SLURM: ``slurm<job id>``. A requeued job keeps its id but is a new
   torchrun, with a new store and a new clock, so the job id names it. (Before
   torchrun's store, since ``sbatch`` runs torchrun inside the job.)
3. Under torchrun: the first rank's clock, agreed through the torchrun agent's
   store with a ``compare_set`` (the first rank to ask sets it; every other
   rank, and every restarted attempt, reads it back). The key is not
   prefixed by the attempt, so restarts find it.
4. Else (one process) the local clock.

Clock stamps read ``%Y%m%d-%H%M%S``, so names that start with one sort by time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from datetime import timedelta

import torch.distributed as dist

STAMP_ENV = "HARNESS_LAUNCH_STAMP"
STORE_KEY = "harness/launch-stamp"  # one per launch: no attempt or sweep job prefix
STORE_TIMEOUT_S = 60.0  # the agent's store answers at once when it is up; this bounds a dead one


def clock() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def under_torchrun_store(env: Mapping[str, str] = os.environ) -> bool:
    """torchrun started this rank and hosts the job's store in its agent."""
    return (
        env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        and "MASTER_ADDR" in env
        and "MASTER_PORT" in env
    )


def shared(env: Mapping[str, str] = os.environ) -> bool:
    """Every rank of the launch reads the same stamp (from the environment, SLURM's job or
    torchrun's store). Else, ranks started without torchrun or SLURM must be told rank 0's."""
    return bool(env.get(STAMP_ENV) or env.get("SLURM_JOB_ID")) or under_torchrun_store(env)


def launch_stamp() -> str:
    """The launch's stamp (see the module's docstring)."""
    if os.environ.get(STAMP_ENV):
        return os.environ[STAMP_ENV]
    if os.environ.get("SLURM_JOB_ID"):
        return f"slurm{os.environ['SLURM_JOB_ID']}"
    if under_torchrun_store():
        return _from_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), clock())
    return clock()


def _from_store(host: str, port: int, mine: str) -> str:
    """``mine``, if this is the first rank of the launch to ask; else the first one's."""
    try:
        store = dist.TCPStore(
            host,
            port,
            None,
            False,
            timeout=timedelta(seconds=STORE_TIMEOUT_S),
            wait_for_workers=False,
        )
        return store.compare_set(STORE_KEY, "", mine).decode()
    except (RuntimeError, dist.DistError) as e:
        raise RuntimeError(
            f"could not reach torchrun's store at {host}:{port} within {STORE_TIMEOUT_S:g} s to "
            "agree on the launch's time stamp (it names the run and sweep directories): is the "
            f"torchrun agent still running? Set {STAMP_ENV}=<YYYYmmdd-HHMMSS> to name the "
            f"launch yourself. Cause: {e}"
        ) from e
