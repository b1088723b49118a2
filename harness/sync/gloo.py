"""``sync=gloo``: one collective broadcast of the packed payload per publish,
on a Gloo group of trainer 0 and the collectors that nothing else uses.
Works between CPU processes on any number of nodes, and for a GPU trainer
with CPU collectors (the payload is staged in pinned CPU memory)."""

from __future__ import annotations

from harness.distributed.setup import Groups
from harness.sync.broadcast import BroadcastSink, BroadcastSource
from harness.sync.contract import Endpoint, SyncSettings, no_groups
from harness.sync.endpoints import Publisher, Subscriber

gpu_collectors = False
make_groups = no_groups


def make_publisher(endpoint: Endpoint, cfg: SyncSettings, groups: Groups) -> Publisher:
    sink = BroadcastSink(endpoint, groups.sync, cfg.timeout_s, groups.store, cfg.bucket_bytes)
    return Publisher(endpoint, cfg, [sink], groups.sync)


def make_subscriber(endpoint: Endpoint, cfg: SyncSettings, groups: Groups) -> Subscriber:
    source = BroadcastSource(endpoint, groups.sync, 0, groups.store, cfg.bucket_bytes)
    return Subscriber(endpoint, cfg, source, groups.sync)
