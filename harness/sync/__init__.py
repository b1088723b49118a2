"""Weight sync schemes, selected by ``sync.name``.

Adding a scheme: one file with a publisher and a subscriber that implement
:mod:`harness.sync.contract`, one line in ``SCHEMES``, one ``conf/sync/*.yaml``.
"""

from __future__ import annotations

from harness.sync.contract import Endpoint, Header, SchemaMismatchError, SyncError, WeightPublisher, WeightSubscriber
from harness.sync.gloo import GlooPublisher, GlooSubscriber
from harness.sync.none import NonePublisher, NoneSubscriber

# name -> (publisher class, subscriber class); each takes (endpoint, timeout_s, group).
SCHEMES = {
    "gloo": (GlooPublisher, GlooSubscriber),
    "none": (NonePublisher, NoneSubscriber),
}

__all__ = [
    "SCHEMES",
    "Endpoint",
    "Header",
    "SchemaMismatchError",
    "SyncError",
    "WeightPublisher",
    "WeightSubscriber",
]
