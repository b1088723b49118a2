"""``sync=none``: collectors keep the weights they started with.

Only the header (version, frames, stop flag, values) travels, over the same
Gloo broadcast as ``sync=gloo``, so rounds and shutdown work unchanged.
"""

from __future__ import annotations

from harness.distributed.setup import Groups
from harness.sync.broadcast import BroadcastSink, BroadcastSource
from harness.sync.contract import Endpoint, SyncSettings, no_groups
from harness.sync.endpoints import Publisher, Subscriber

gpu_collectors = False
make_groups = no_groups


def make_publisher(endpoint: Endpoint, cfg: SyncSettings, groups: Groups) -> Publisher:
    sink = BroadcastSink(endpoint, groups.sync, cfg.timeout_s, groups.store, late_s=cfg.late_s)
    return Publisher(endpoint, cfg, [sink], groups.sync, header_only=True)


def make_subscriber(endpoint: Endpoint, cfg: SyncSettings, groups: Groups) -> Subscriber:
    source = BroadcastSource(endpoint, groups.sync, 0, groups.store)
    return Subscriber(endpoint, cfg, source, groups.sync, header_only=True)
