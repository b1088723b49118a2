"""Weight sync schemes, selected by ``sync.name``.

Each scheme is one module with ``make_publisher`` and ``make_subscriber``
that assemble :mod:`harness.sync.endpoints` from transports
(:mod:`~harness.sync.broadcast`, :mod:`~harness.sync.shared_memory`), which
are the sinks and sources of :mod:`harness.sync.contract`; what travels is a
:class:`~harness.sync.payload.Payload`.
Adding one: a module that is a :class:`~harness.sync.contract.Scheme` (what it needs of
the job: ``gpu_collectors`` and ``make_groups``; its two ends), a line in ``SCHEMES``, a
``conf/sync/<name>.yaml``. Nothing outside ``harness/sync/`` knows a scheme by its name.
"""

from __future__ import annotations

from harness.distributed.handshake import HandshakeError, SchemaMismatchError
from harness.distributed.setup import Groups
from harness.sync import gloo, hierarchical, nccl, none, shm
from harness.sync.contract import (
    Endpoint,
    Header,
    Scheme,
    SyncError,
    SyncSettings,
    WeightPublisher,
    WeightSubscriber,
)

SCHEMES: dict[str, Scheme] = {
    "gloo": gloo,
    "nccl": nccl,
    "shm": shm,
    "hierarchical": hierarchical,
    "none": none,
}


def make_publisher(cfg: SyncSettings, rank: int, groups: Groups) -> WeightPublisher:
    """Trainer 0's end of the scheme ``cfg.name``."""
    return SCHEMES[cfg.name].make_publisher(Endpoint(rank, "trainer", cfg.name), cfg, groups)


def make_subscriber(cfg: SyncSettings, rank: int, groups: Groups) -> WeightSubscriber:
    """A collector's end of the scheme ``cfg.name``."""
    return SCHEMES[cfg.name].make_subscriber(Endpoint(rank, "collector", cfg.name), cfg, groups)


__all__ = [
    "SCHEMES",
    "Endpoint",
    "HandshakeError",
    "Header",
    "SchemaMismatchError",
    "Scheme",
    "SyncError",
    "WeightPublisher",
    "WeightSubscriber",
    "make_publisher",
    "make_subscriber",
]
