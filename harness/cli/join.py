"""Collectors that join a running job, and leave it, without restarting it (``harness join``).

    harness join HOST:PORT                                  # one collector
    harness join --nproc 4 HOST:PORT                        # four, one per process
    srun --ntasks=16 python -m harness.cli.join HOST:PORT   # a pool of CPU nodes for a GPU job

``HOST:PORT`` is trainer 0's node and the job's ``topology.join_port``. Each
process is one collector: it reads the job's config from the job, makes the
same envs and policy as the job's own collectors, takes the newest weights
(:mod:`harness.sync.store`) and streams its batches to trainer 0
(:mod:`harness.data.joined`) until the job ends, or until it is asked to stop
(SIGTERM, SIGINT: it sends its batch in hand, says goodbye and exits).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from dataclasses import replace
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from harness.algos import ALGOS
from harness.cli.usage import HELP_FLAGS, UsageError, command
from harness.config import Config, load, register_configs
from harness.core.packing import schema
from harness.data.joined import (
    CONFIG,
    COUNT,
    HEADER_ONLY,
    PREFIX,
    JoinedSender,
    answer_key,
    hello_key,
    pair_group,
)
from harness.distributed import signals
from harness.roles.collector import collect_loop, make_collector
from harness.sync import Endpoint, Header, WeightSubscriber
from harness.sync.endpoints import Subscriber
from harness.sync.store import StoreSource

log = logging.getLogger("harness")
# joined collector n seeds as rank JOINED_RANKS + n: apart from every rank of the job
JOINED_RANKS = 100_000
HELP = """\
Collectors that join a running job (topology.join_port > 0) and leave it, without restarting it.
Each process is one collector: it reads the job's config from the job, takes its newest weights
and streams its batches to trainer 0 until the job ends, or until it is asked to stop (Ctrl-C,
SIGTERM: it sends its batch in hand, says goodbye and exits).

  HOST:PORT    trainer 0's node and the job's topology.join_port (trainer 0 prints both)"""


class Leaving(WeightSubscriber):
    """``subscriber``, whose headers say stop once this process was asked to stop (SIGTERM,
    SIGINT)."""

    def __init__(self, subscriber: WeightSubscriber):
        super().__init__(subscriber.endpoint, subscriber.timeout_s)
        self.inner = subscriber

    def connect(self, models, value_names=()) -> None:  # type: ignore[no-untyped-def]  # as the subscriber's
        self.inner.connect(models, value_names)

    def poll(self) -> Optional[Header]:
        header = self.inner.poll()
        return self.current_header() if signals.requested() else header

    def wait(self, min_version: int, timeout_s: Optional[float] = None) -> Header:
        if not signals.requested() or self.inner.header is None:
            self.inner.wait(min_version, timeout_s)
        return self.current_header()

    def current_header(self) -> Header:
        header = self.inner.current_header()
        return replace(header, stop=True) if signals.requested() else header

    def close(self) -> None:
        self.inner.close()


def job_config(text: str) -> Config:
    """The job's ``config.yaml`` as its own ranks read it."""
    raw = OmegaConf.create(text)
    merged = OmegaConf.merge(OmegaConf.structured(Config(algo=ALGOS[raw.algo.name].Config())), raw)
    assert isinstance(merged, DictConfig)  # a mapping merged into a mapping
    return load(merged)


def join(host: str, port: int) -> None:
    store = dist.PrefixStore(
        PREFIX, dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=60))
    )
    cfg = job_config(store.get(CONFIG).decode())
    number = int(store.add(COUNT, 1))
    collector, models, values, _ = make_collector(cfg, JOINED_RANKS + number)
    hello = {"schema": schema(collector.batch), "host": socket.gethostname(), "pid": os.getpid()}
    store.set(hello_key(number), json.dumps(hello))
    answer = store.get(answer_key(number)).decode()  # the trainer answers between its updates
    if answer != "ok":
        raise SystemExit(f"the job at {host}:{port} refused this collector: {answer}")
    group = pair_group(store, number, 1, cfg.dist_timeout_s)
    source = StoreSource(store, poll_interval_s=0.005)
    endpoint = Endpoint(JOINED_RANKS + number, "joined collector", cfg.sync.name)
    header_only = store.get(HEADER_ONLY) == b"1"
    subscriber = Leaving(Subscriber(endpoint, cfg.sync, source, None, header_only=header_only))
    subscriber.connect(models, values)
    log.info("joined the job at %s:%d as collector %d", host, port, number)
    try:
        collect_loop(
            cfg,
            JOINED_RANKS + number,
            collector,
            subscriber,
            JoinedSender(group, cfg.dist_timeout_s),
            None,
        )
    finally:
        collector.envs.close()
    log.info("collector %d left the job", number)


def main(argv: Optional[list[str]] = None) -> int:
    """``harness join HOST:PORT`` in this process: one collector. A mistake raises
    :class:`UsageError`."""
    args = sys.argv[1:] if argv is None else argv
    if any(a in HELP_FLAGS for a in args):
        print(HELP, flush=True)
        return 0
    host, _, port = (args[0] if args else "").rpartition(":")
    if len(args) != 1 or not host or not port.isdigit():
        raise UsageError(
            f"harness join takes HOST:PORT, trainer 0's node and the job's topology.join_port "
            f"(got {' '.join(args) or 'nothing'})"
        )
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # a collector's one thread, as a job's collectors take
    register_configs()
    signals.install()
    try:
        join(host, int(port))
    except (RuntimeError, dist.DistStoreError) as e:
        print(f"harness join {host}:{port}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(command(main))
