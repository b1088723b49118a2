"""``sync=nccl``: the gloo scheme's broadcast on CUDA buffers over an NCCL
group of its own; collectors' models live on their GPU."""

from __future__ import annotations

import inspect
import os
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from harness.distributed.setup import Groups
from harness.distributed.topology import Layout
from harness.sync.broadcast import BroadcastSink, BroadcastSource
from harness.sync.contract import Endpoint, SyncError, SyncSettings
from harness.sync.endpoints import Publisher, Subscriber

gpu_collectors = True  # one GPU per rank: the weights arrive in GPU memory


def watchdog_s(wait_s: float) -> float:
    """How long NCCL's watchdog lets an operation run before it aborts the process (SIGABRT).

    A collector keeps a receive posted on the weights group from one publish
    to the next, so a trainer's longest planned silence (a first compiled
    update, a checkpoint with the replay, the final evaluation) must fit in
    it. Those gaps are bounded by the harness's own waits (``wait_s``: the
    longer of ``sync.timeout_s`` and ``dist_timeout_s``), which end with an
    error naming the rank and what it waited for; the watchdog's abort names
    nothing. Twice the harness's wait and a minute more: its error comes first.
    """
    return 2 * wait_s + 60


def make_groups(groups: Groups, layout: Layout, wait_s: float) -> None:
    """An NCCL group of trainer 0 and the collectors, every operation bounded by :func:`watchdog_s`.

    Async error handling stays on (torch's default, set here in case the
    environment turned it off): the watchdog ends a rank whose operation
    outlives the timeout instead of leaving it hung on the GPU. ``device_id``
    (where this torch has it) binds the communicator to the rank's GPU, and
    its members create it now (:func:`create_communicator`)."""
    if os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0") == "0":
        # tear the process down on a timeout or error
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "3"
    members = [0, *layout.collector_ranks]
    kwargs: dict[str, Any] = {}
    if groups.device is not None and "device_id" in inspect.signature(dist.new_group).parameters:
        kwargs["device_id"] = groups.device
    timeout = timedelta(seconds=watchdog_s(wait_s))
    groups.scheme_group = dist.new_group(members, timeout=timeout, backend="nccl", **kwargs)
    if layout.rank in members:
        create_communicator(groups.scheme_group, groups.device, wait_s)


def create_communicator(
    group: dist.ProcessGroup, device: Optional[torch.device], timeout_s: float
) -> None:
    """One small all-reduce on ``group``, waited for: its NCCL communicator exists from here on.

    Created lazily, it would be made inside a collector's first posted receive,
    which (depending on the torch version) can block that rank until every
    member joins, while trainer 0 waits for the collector in the data
    channel's handshake: a deadlock. A bad GPU layout also fails here, at start-up.
    """
    probe = torch.zeros(1, device=device)
    work = dist.all_reduce(probe, group=group, async_op=True)
    assert work is not None  # async_op=True returns the work
    work.wait(timedelta(seconds=timeout_s))
    torch.cuda.synchronize(device)


def _device(endpoint: Endpoint, groups: Groups) -> tuple[str, dist.ProcessGroup]:
    """The rank's GPU, as its placement chose it, and the NCCL group bound to it."""
    if not torch.cuda.is_available() or groups.scheme_group is None or groups.device is None:
        raise SyncError(
            f"{endpoint}: sync=nccl needs a GPU on every rank and this rank has none: use sync=gloo"
        )
    return str(groups.device), groups.scheme_group


def make_publisher(endpoint: Endpoint, cfg: SyncSettings, groups: Groups) -> Publisher:
    device, group = _device(endpoint, groups)
    sink = BroadcastSink(
        endpoint, group, cfg.timeout_s, groups.store, cfg.bucket_bytes, late_s=cfg.late_s
    )
    return Publisher(endpoint, cfg, [sink], groups.sync, device)


def make_subscriber(endpoint: Endpoint, cfg: SyncSettings, groups: Groups) -> Subscriber:
    device, group = _device(endpoint, groups)
    source = BroadcastSource(endpoint, group, 0, groups.store, cfg.bucket_bytes)
    return Subscriber(endpoint, cfg, source, groups.sync, device=device)
