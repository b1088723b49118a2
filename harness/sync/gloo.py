"""``sync=gloo``: the packed payload broadcast in buckets from trainer 0 to the collectors, over
Gloo groups that nothing else uses. Works between CPU processes on any number of nodes, and for
a GPU trainer with CPU collectors (the payload is staged in pinned CPU memory).

With up to :data:`FAN_OUT_UP_TO` collectors, each bucket is broadcast on a two-rank group per
collector, all at once: every such group has its own Gloo threads, so trainer 0 writes to every
collector's socket together, as the raw TCP floor of ``benchmarks/weight_sync.py`` does. Gloo's
own broadcast on one group (a binomial tree) serves them from one thread, one after the other:
1.7-2.1x that floor with 2 collectors, where the pairs take 0.85-1.18x (docs/weight_sync.md).
With more collectors the tree's forwarding spares trainer 0's link (it sends log2(n + 1) copies,
not n), and each pair would cost it three threads: the job's sync group carries the broadcast.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from harness.distributed.setup import Groups
from harness.distributed.topology import Layout
from harness.sync.broadcast import BroadcastSink, BroadcastSource
from harness.sync.contract import Endpoint, SyncSettings
from harness.sync.endpoints import Publisher, Subscriber

gpu_collectors = False
FAN_OUT_UP_TO = 4  # collectors served by a group each, at once; beyond, Gloo's tree


def make_groups(groups: Groups, layout: Layout, wait_s: float) -> None:
    """A two-rank Gloo group of trainer 0 and each collector, when there are 2 to
    :data:`FAN_OUT_UP_TO` of them (with one, the sync group is that pair)."""
    collectors = layout.collector_ranks
    if 2 <= len(collectors) <= FAN_OUT_UP_TO:
        timeout = timedelta(seconds=wait_s)
        groups.scheme_pairs = {
            c: dist.new_group([0, c], timeout=timeout, backend="gloo") for c in collectors
        }


def make_publisher(endpoint: Endpoint, cfg: SyncSettings, groups: Groups) -> Publisher:
    sink = BroadcastSink(
        endpoint,
        groups.sync,
        cfg.timeout_s,
        groups.store,
        cfg.bucket_bytes,
        pairs=list(groups.scheme_pairs.values()),
        late_s=cfg.late_s,
    )
    return Publisher(endpoint, cfg, [sink], groups.sync)


def make_subscriber(endpoint: Endpoint, cfg: SyncSettings, groups: Groups) -> Subscriber:
    group = groups.scheme_pairs.get(endpoint.rank, groups.sync)
    source = BroadcastSource(endpoint, group, 0, groups.store, cfg.bucket_bytes)
    return Subscriber(endpoint, cfg, source, groups.sync)
