"""Weight sync schemes, selected by ``sync.name``.

Each scheme is one module with ``make_publisher`` and ``make_subscriber``
that assemble :mod:`harness.sync.endpoints` from transports
(:mod:`~harness.sync.broadcast`, :mod:`~harness.sync.shared_memory`).
Adding one: a module, a line in ``SCHEMES``, a ``conf/sync/<name>.yaml``.
"""

from __future__ import annotations

from harness.sync import gloo, hierarchical, nccl, none, shm
from harness.sync.contract import Endpoint, Header, SchemaMismatchError, SyncError, WeightPublisher, WeightSubscriber

SCHEMES = {"gloo": gloo, "nccl": nccl, "shm": shm, "hierarchical": hierarchical, "none": none}


def make_publisher(cfg, rank: int, groups) -> WeightPublisher:
    """Trainer 0's end of the scheme ``cfg.name`` (a :class:`SyncConfig`)."""
    return SCHEMES[cfg.name].make_publisher(Endpoint(rank, "trainer", cfg.name), cfg, groups)


def make_subscriber(cfg, rank: int, groups) -> WeightSubscriber:
    """A collector's end of the scheme ``cfg.name``."""
    return SCHEMES[cfg.name].make_subscriber(Endpoint(rank, "collector", cfg.name), cfg, groups)


__all__ = ["SCHEMES", "Endpoint", "Header", "SchemaMismatchError", "SyncError", "WeightPublisher",
           "WeightSubscriber", "make_publisher", "make_subscriber"]
