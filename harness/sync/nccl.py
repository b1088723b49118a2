"""``sync=nccl``: the gloo scheme's broadcast on CUDA buffers over an NCCL
group of its own; collectors' models live on their GPU."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from harness.distributed.setup import Groups
from harness.sync.broadcast import BroadcastSink, BroadcastSource
from harness.sync.contract import Endpoint, SyncError
from harness.sync.endpoints import Publisher, Subscriber

if TYPE_CHECKING:  # the config module imports the scheme registry, so only for type checkers
    from harness.sync.config import SyncConfig


def _device(endpoint: Endpoint, groups: Groups) -> str:
    """The rank's GPU, as its placement chose it (init_distributed bound the NCCL group to it)."""
    if not torch.cuda.is_available() or groups.sync_nccl is None or groups.nccl_device is None:
        raise SyncError(f"{endpoint}: sync=nccl needs a GPU on every rank and this rank has none: use sync=gloo")
    return str(groups.nccl_device)


def make_publisher(endpoint: Endpoint, cfg: SyncConfig, groups: Groups) -> Publisher:
    device = _device(endpoint, groups)
    assert groups.sync_nccl is not None  # _device refuses a job without one
    sink = BroadcastSink(endpoint, groups.sync_nccl, cfg.timeout_s, groups.store)
    return Publisher(endpoint, cfg.timeout_s, [sink], groups.sync, cfg.torch_wire_dtype, device)


def make_subscriber(endpoint: Endpoint, cfg: SyncConfig, groups: Groups) -> Subscriber:
    device = _device(endpoint, groups)
    assert groups.sync_nccl is not None  # _device refuses a job without one
    source = BroadcastSource(endpoint, groups.sync_nccl, 0, groups.store)
    return Subscriber(endpoint, cfg.timeout_s, source, groups.sync, wire_dtype=cfg.torch_wire_dtype, device=device)
