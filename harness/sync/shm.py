"""``sync=shm``: trainer 0 writes a named shared-memory segment that the
collectors on its node read (see :mod:`harness.sync.shared_memory`). The
trainer never waits for a reader; a reader never sees a torn update."""

from __future__ import annotations

import torch.distributed as dist

from harness.distributed.setup import Groups
from harness.sync.contract import Endpoint, SyncError, SyncSettings, no_groups
from harness.sync.endpoints import Publisher, Subscriber
from harness.sync.shared_memory import ShmSink, ShmSource

gpu_collectors = False
make_groups = no_groups


def exchange_segment_names(groups: Groups, node: int, sink: ShmSink | None) -> dict[int, str]:
    """Every member of the sync group learns which segment serves each node.
    (torchrun's ranks are not forked from one parent: names are the only link.)"""
    entries: list = [None] * dist.get_world_size(groups.sync)
    mine = None
    if sink is not None:
        assert sink.segment is not None  # sinks are opened before the names are exchanged
        mine = (node, sink.segment.name)
    dist.all_gather_object(entries, mine, group=groups.sync)
    return {n: name for n, name in filter(None, entries)}


def check_one_node(endpoint: Endpoint, groups: Groups) -> None:
    members = dist.get_process_group_ranks(groups.sync)
    away = [r for r in members if groups.nodes[r] != groups.nodes[0]]
    if away:
        raise SyncError(
            f"{endpoint}: sync=shm needs every collector on trainer 0's node (node "
            f"{groups.nodes[0]}); collector ranks {away} run on other nodes. Use sync=hierarchical "
            "(broadcast between nodes, shared memory inside each) or sync=gloo."
        )


def make_publisher(endpoint: Endpoint, cfg: SyncSettings, groups: Groups) -> Publisher:
    check_one_node(endpoint, groups)
    sink = ShmSink(groups.nodes[0], readers=dist.get_world_size(groups.sync) - 1)
    return Publisher(
        endpoint,
        cfg,
        [sink],
        groups.sync,
        after_open=lambda: exchange_segment_names(groups, groups.nodes[0], sink),
    )


def make_subscriber(endpoint: Endpoint, cfg: SyncSettings, groups: Groups) -> Subscriber:
    check_one_node(endpoint, groups)
    source = ShmSource(cfg.poll_interval_s)
    node = groups.nodes[endpoint.rank]
    return Subscriber(
        endpoint,
        cfg,
        source,
        groups.sync,
        before_source=lambda: source.attach(exchange_segment_names(groups, node, None)[node]),
    )
