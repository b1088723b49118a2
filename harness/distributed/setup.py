"""Process groups and the shared run directory, made once at start-up.

Every rank creates every group in the same order (torch.distributed requires
it), so each channel gets a group of its own and collectives never interleave.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Optional, Protocol

import torch
import torch.distributed as dist

from harness.distributed import launch_stamp
from harness.distributed.roll_call import RollCall, ranks_text
from harness.distributed.topology import Layout
from harness.distributed.waits import Wait


@dataclass
class Groups:
    """One process group per channel, plus where every rank runs."""

    sync: dist.ProcessGroup  # trainer 0 + collectors (gloo): weights, and every scheme's handshake
    data: dist.ProcessGroup  # every rank: batches, collectors -> trainers
    trainers: dist.ProcessGroup | None  # trainers only: DDP; None with one trainer
    nodes: list[int]  # node rank of every global rank
    device: torch.device | None = None  # this rank's GPU, when its placement gave it one
    # the weight sync scheme's own group, if it makes one
    scheme_group: dist.ProcessGroup | None = None
    # the scheme's two-rank groups of trainer 0 and each collector, by collector rank, if it makes
    # them (collectives pass GroupMember.NON_GROUP_MEMBER to the ranks outside a group)
    scheme_pairs: dict[int, dist.ProcessGroup] = field(default_factory=dict)
    # the job's store: roll calls that name the ranks a wait waited for
    store: dist.Store | None = None

    def node_leaders(self, collectors: list[int]) -> list[int]:
        """The lowest collector rank of each node other than trainer 0's."""
        leaders: dict[int, int] = {}
        for rank in collectors:
            if self.nodes[rank] != self.nodes[0]:
                leaders.setdefault(self.nodes[rank], rank)
        return sorted(leaders.values())


def join(
    layout: Layout, timeout_s: float, role: str | None = None, sweep_job: int = 0
) -> dist.Store:
    """Join the job's default (Gloo) group, every collective bounded by
    ``timeout_s``; the ranks that never came are named in the error.
    ``sweep_job``: a Hydra sweep's job number (each job of a sweep meets anew).
    Returns the job's store (roll calls: :mod:`harness.distributed.roll_call`)."""
    timeout = timedelta(seconds=timeout_s)
    who = f"rank {layout.rank} ({role or layout.role})"
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    store = _job_store(layout, timeout, who, where, sweep_job)
    joined = RollCall(store, "joined")
    joined.mark(layout.rank)
    wait = Wait(timeout_s, "dist_timeout_s")
    try:
        dist.init_process_group(
            "gloo", rank=layout.rank, world_size=layout.world_size, timeout=timeout, store=store
        )
    except (RuntimeError, dist.DistError) as e:
        missing = joined.behind(range(layout.world_size))
        absent = (
            f"rank{'s' * (len(missing) > 1)} {ranks_text(missing)} never came"
            if missing
            else "every rank came, then one died"
            if missing == []
            else "the store is gone too, so which rank is unknown"
        )
        raise RuntimeError(
            f"{who} stopped waiting for all {layout.world_size} ranks to join at {where}: "
            f"{wait.ended(e)}; {absent}. Check their "
            f"logs{wait.advice('start-up is just slow')}. Cause: {e}"
        ) from e
    return store


class SchemeGroups(Protocol):
    """What a weight sync scheme adds to the job's groups (every scheme of ``harness.sync`` is
    one)."""

    def make_groups(self, groups: Groups, layout: Layout, wait_s: float) -> None: ...


def init_distributed(
    layout: Layout,
    timeout_s: float,
    scheme: Optional[SchemeGroups] = None,
    device: Optional[torch.device | str] = None,
    wait_s: Optional[float] = None,
    sweep_job: int = 0,
) -> Groups:
    """Join the job's default group, learn every rank's node, then make one
    group per channel (every rank creates every group, in the same order), and
    the groups ``scheme`` makes for itself. ``device``: this rank's GPU, if its
    placement gave it one; ``wait_s``: the longest wait the harness bounds itself
    on the scheme's groups (default ``timeout_s``); ``sweep_job``: as :func:`join`'s.
    """
    store = join(layout, timeout_s, sweep_job=sweep_job)
    timeout = timedelta(seconds=timeout_s)
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(layout.world_size)]
    dist.all_gather(gathered, torch.tensor([layout.node_rank]))
    nodes = [int(n) for n in gathered]
    sync = dist.new_group([0, *layout.collector_ranks], timeout=timeout, backend="gloo")
    data = dist.new_group(list(range(layout.world_size)), timeout=timeout, backend="gloo")
    trainers = None
    if layout.trainers > 1:
        trainers = dist.new_group(list(range(layout.trainers)), timeout=timeout, backend="gloo")
    device = None if device is None else torch.device(device)
    groups = Groups(
        sync=sync, data=data, trainers=trainers, nodes=nodes, device=device, store=store
    )
    if scheme is not None:
        scheme.make_groups(groups, layout, wait_s or timeout_s)
    return groups


def _job_store(
    layout: Layout, timeout: timedelta, who: str, where: str, sweep_job: int
) -> dist.Store:
    """The store every rank meets at: under torchrun, one whose keys are
    private to this restart attempt; else (``srun``, spawned ranks) one that
    rank 0 hosts at ``MASTER_ADDR:MASTER_PORT``, without waiting for the
    others, so that a rank that never comes is named by the join instead.

    After ``--max-restarts`` restarts a job, the store can still hold the
    previous attempt's keys, among them the listening addresses of ranks that
    are dead now; new ranks would read those and fail with "connection
    refused". Prefixing every key with the attempt number keeps attempts apart.
    A Hydra sweep (``-m``) runs its jobs one after another in the same ranks,
    each job joining anew: the sweep job's number keeps the jobs apart in
    the same way.
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    agent_hosts_store = (
        attempt is not None and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    )
    try:
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            layout.world_size,
            is_master=not agent_hosts_store and layout.rank == 0,
            timeout=timeout,
            wait_for_workers=False,
        )
    except (RuntimeError, dist.DistError) as e:
        raise RuntimeError(
            f"{who} could not reach the job's store at {where} within {timeout.total_seconds():g} "
            f"s: {'its torchrun agent' if agent_hosts_store else 'rank 0, which hosts it,'} never "
            f"started or cannot be reached from here. Cause: {e}"
        ) from e
    return dist.PrefixStore(f"harness/attempt-{attempt or 0}/job-{sweep_job}", store)


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def resolve_run_dir(
    run_dir: str | None, runs_root: str, run_name: str | None, what: str, layout: Layout
) -> Path:
    """One directory for the whole job, the same on every rank.

    In order: ``run_dir=``; ``<runs_root>/<run_name>``, which the same command
    finds again (and resumes); else ``<runs_root>/<launch stamp>-<what>``
    (``what``: ``<algo>-<env id>-seed<seed>``), time first so that ``ls`` sorts
    runs by their start. The launch's stamp is the same on every rank and in a
    restarted attempt (:mod:`harness.distributed.launch_stamp`: torchrun's store,
    the SLURM job id); ranks started without either are told rank 0's clock
    (never each rank's own, which would split one job into many directories).
    """
    if run_dir:
        return Path(run_dir)
    if run_name:
        return Path(runs_root) / run_name
    stamp = [launch_stamp.launch_stamp()]
    if not layout.single_process and not launch_stamp.shared():
        dist.broadcast_object_list(stamp, src=0)
    # a namespaced env id (ALE/Pong-v5) stays one name
    return Path(runs_root) / f"{stamp[0]}-{what.replace(os.sep, '-')}"
