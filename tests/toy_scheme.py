"""A toy weight sync scheme, added from outside the package: ``HARNESS_PLUGINS=toy_scheme`` (with
``tests/`` on the path) imports this module in every process before it composes a config; it adds
``toy_store`` to ``SCHEMES`` and its YAML node to Hydra's ConfigStore, so that ``sync=toy_store``
works as ``conf/sync/<name>.yaml`` would (docs/extending.md; tests/launch/test_extending.py).

``sync=toy_store``: trainer 0 writes every publish as one value of the job's TCP store (the
rendezvous store every rank already holds), and collectors read it when its version is newer: the
transport of collectors that join a running job (:mod:`harness.sync.store`), for a whole job. It
keeps the contract with the transport's and the endpoints' own means: a store's ``set`` replaces
a value whole (never torn); a reader applies only newer versions (monotonic); every read and wait
has a timeout (bounded); ``connect`` checks the schema on the job's weights group (checked).
"""

from __future__ import annotations

import sys
from typing import cast

import torch.distributed as dist
from hydra.core.config_store import ConfigStore

from harness.distributed.setup import Groups
from harness.sync import SCHEMES, Scheme
from harness.sync.contract import Endpoint, SyncSettings, no_groups
from harness.sync.endpoints import Publisher, Subscriber
from harness.sync.store import StoreSink, StoreSource

gpu_collectors = False
make_groups = no_groups  # the job's weights group (groups.sync) carries the schema check


def job_store(groups: Groups) -> dist.Store:
    """The job's store, under keys of this scheme's own."""
    assert groups.store is not None  # init_distributed gives every rank the job's store
    return dist.PrefixStore("toy_store", groups.store)


def make_publisher(endpoint: Endpoint, cfg: SyncSettings, groups: Groups) -> Publisher:
    sink = StoreSink(job_store(groups))
    return Publisher(endpoint, cfg, [sink], groups.sync)


def make_subscriber(endpoint: Endpoint, cfg: SyncSettings, groups: Groups) -> Subscriber:
    source = StoreSource(job_store(groups), cfg.poll_interval_s)
    return Subscriber(endpoint, cfg, source, groups.sync)


SCHEMES["toy_store"] = cast(Scheme, sys.modules[__name__])  # this module is the scheme
# What conf/sync/toy_store.yaml would hold. A reader asks the trainer's node over TCP: every 5 ms
# at most, not before every env step as a shared-memory reader does.
ConfigStore.instance().store(
    group="sync", name="toy_store", node={"name": "toy_store", "poll_interval_s": 0.005}
)
