"""``sync=hierarchical``: broadcast between nodes, shared memory inside each.

Trainer 0 writes a segment for the collectors of its own node and broadcasts
over a Gloo group of node leaders (the lowest collector rank of every other
node). Each leader applies the update to its own policy and writes it into a
segment for the other collectors of its node.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from harness.distributed.setup import Groups
from harness.distributed.topology import Layout
from harness.sync.broadcast import BroadcastSink, BroadcastSource
from harness.sync.contract import Endpoint, Sink, SyncSettings
from harness.sync.endpoints import Publisher, Subscriber
from harness.sync.shared_memory import ShmSink, ShmSource
from harness.sync.shm import exchange_segment_names

gpu_collectors = False


def make_groups(groups: Groups, layout: Layout, wait_s: float) -> None:
    """The node leaders' Gloo group: trainer 0 and the lowest collector rank of every other node."""
    leaders = [0, *groups.node_leaders(layout.collector_ranks)]
    groups.scheme_group = dist.new_group(leaders, timeout=timedelta(seconds=wait_s), backend="gloo")


def _leaders(groups: Groups) -> dist.ProcessGroup:
    assert groups.scheme_group is not None  # make_groups made it
    return groups.scheme_group


def _collectors(groups: Groups) -> list[int]:
    return [r for r in dist.get_process_group_ranks(groups.sync) if r != 0]


def make_publisher(endpoint: Endpoint, cfg: SyncSettings, groups: Groups) -> Publisher:
    collectors = _collectors(groups)
    node = groups.nodes[0]
    readers = sum(groups.nodes[c] == node for c in collectors)
    local = ShmSink(node, readers) if readers else None
    sinks: list[Sink] = [s for s in (local,) if s is not None]
    if groups.node_leaders(collectors):
        sinks.append(
            BroadcastSink(
                endpoint,
                _leaders(groups),
                cfg.timeout_s,
                groups.store,
                cfg.bucket_bytes,
                late_s=cfg.late_s,
            )
        )
    return Publisher(
        endpoint,
        cfg,
        sinks,
        groups.sync,
        after_open=lambda: exchange_segment_names(groups, node, local),
    )


def make_subscriber(endpoint: Endpoint, cfg: SyncSettings, groups: Groups) -> Subscriber:
    collectors = _collectors(groups)
    node = groups.nodes[endpoint.rank]
    if endpoint.rank in groups.node_leaders(collectors):
        followers = sum(groups.nodes[c] == node and c != endpoint.rank for c in collectors)
        forward = ShmSink(node, followers) if followers else None
        return Subscriber(
            endpoint,
            cfg,
            BroadcastSource(endpoint, _leaders(groups), 0, groups.store, cfg.bucket_bytes),
            groups.sync,
            forward=forward,
            before_source=lambda: exchange_segment_names(groups, node, forward),
        )
    source = ShmSource(cfg.poll_interval_s)
    subscriber = Subscriber(
        endpoint,
        cfg,
        source,
        groups.sync,
        before_source=lambda: source.attach(exchange_segment_names(groups, node, None)[node]),
    )
    # it reads what its node's leader forwards: that is the rank to look at
    if node != groups.nodes[0]:
        leader = next(r for r in groups.node_leaders(collectors) if groups.nodes[r] == node)
        subscriber.upstream = f"rank {leader} (node {node}'s leader)"
    return subscriber
