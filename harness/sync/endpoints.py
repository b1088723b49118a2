"""A publisher and a subscriber built from transports, which is what every
scheme is: the publisher writes the current weights to its sinks; the
subscriber applies what its source delivers into the buffer its models view,
and may forward it to a sink of its own (a node leader in ``hierarchical``).
Sinks and sources are :class:`~harness.sync.contract.Sink` and
:class:`~harness.sync.contract.Source`.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn

from harness.core.packing import leaf_tensors
from harness.distributed.handshake import check_schema
from harness.distributed.waits import Wait
from harness.sync.contract import (
    CorruptWeightsError,
    Endpoint,
    Header,
    Sink,
    Source,
    SyncError,
    SyncSettings,
    WeightPublisher,
    WeightSubscriber,
)
from harness.sync.digest import PendingDigest, digest, verified
from harness.sync.payload import DEVICE_TO_HOST, Payload, staging_path, weights_of


class Publisher(WeightPublisher):
    """Trainer 0's end: every publish goes to each of ``sinks``. ``settings`` (the ``sync`` section)
    are taken whole, so that every scheme, a plugin's included, keeps the wire dtype, the timeout
    and the digests of ``sync.verify`` without passing each on."""

    def __init__(
        self,
        endpoint: Endpoint,
        settings: SyncSettings,
        sinks: Sequence[Sink],
        handshake_group: dist.ProcessGroup,
        device: str = "cpu",
        after_open: Callable[[], object] = lambda: None,  # what it returns is ignored
        header_only: bool = False,
    ):
        super().__init__(endpoint, settings.timeout_s)
        self.verify = settings.verify  # the versions it digests for collectors to check
        self.sinks, self.group, self.wire_dtype, self.device = (
            sinks,
            handshake_group,
            settings.torch_wire_dtype,
            device,
        )
        self.after_open = after_open  # e.g. tell readers the names of the segments the sinks made
        self.header_only = header_only  # sync=none: only the header travels

    @property
    def delivers_weights(self) -> bool:
        return not self.header_only

    def add_sink(self, sink: Sink) -> None:
        """Also write every publish to ``sink`` (before ``connect``, which opens it)."""
        self.sinks = [*self.sinks, sink]

    def connect(self, models: Mapping[str, nn.Module], value_names: Sequence[str] = ()) -> None:
        models = {} if self.header_only else models
        self.source = weights_of(models)
        # A GPU trainer's weights reach CPU transports through pinned memory (Payload.write).
        pin = any(
            staging_path(t.device, torch.device(self.device)) == DEVICE_TO_HOST
            for t in leaf_tensors(self.source)
        )

        def make_payload() -> Payload:
            return Payload.from_models(models, value_names, self.wire_dtype, self.device, pin)

        template = make_payload()
        self.payload_bytes = template.buffer.numel()
        check_schema(
            template.schema,
            group=self.group,
            root=self.endpoint.rank,
            who=str(self.endpoint),
            what="weights",
        )
        for sink in self.sinks:
            sink.open(make_payload)
        self.after_open()
        # The schema's template is a full copy of the weights, and TensorDict's packed payloads
        # sit in reference cycles: without a collection it stays until Python's collector runs.
        del template
        gc.collect()

    def publish(self, header: Header) -> None:
        pending = None
        if verified(self.verify, header.version):
            pending = PendingDigest(lambda: digest(map(self.as_held, leaf_tensors(self.source))))
        for sink in self.sinks:
            # A sink that can take the digest on the way (while its first pieces travel, or folded
            # into its copy) is handed it pending; the others get it in the header.
            write_digesting = getattr(sink, "write_digesting", None)
            if pending is not None and write_digesting is not None:
                write_digesting(self.source, header, pending)
            elif pending is not None:
                sink.write(self.source, replace(header, digest=pending.value))
            else:
                sink.write(self.source, header)

    def as_held(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` as a collector's model holds it: rounded through the wire dtype, if one is set
        (one tensor at a time: never a second full copy)."""
        if self.wire_dtype is None or t.dtype != torch.float32:
            return t
        return t.to(self.wire_dtype).to(t.dtype)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


class Subscriber(WeightSubscriber):
    """A collector's end: applies what ``source`` delivers, then hands it to
    ``forward`` if it has one."""

    def __init__(
        self,
        endpoint: Endpoint,
        settings: SyncSettings,
        source: Source,
        handshake_group: dist.ProcessGroup | None,
        publisher_rank: int = 0,
        forward: Sink | None = None,
        device: str = "cpu",
        before_source: Callable[[], object] = lambda: None,  # what it returns is ignored
        header_only: bool = False,
        verify: str | None = None,
    ):
        super().__init__(endpoint, settings.timeout_s)
        # The versions it checks against their digests: sync.verify's, unless told (a supervised
        # collector's worker reads what its rank checked).
        self.verify = settings.verify if verify is None else verify
        self.source, self.group = source, handshake_group
        self.forwards: list[Sink] = [] if forward is None else [forward]
        self.publisher_rank, self.device = publisher_rank, device
        self.wire_dtype = settings.torch_wire_dtype
        self.before_source = before_source  # e.g. learn the name of the segment to read
        self.header_only = header_only

    @property
    def delivers_weights(self) -> bool:
        return not self.header_only

    def relay_to(self, sink: Sink) -> None:
        """Also hand every update applied to ``sink`` (before ``connect``, which opens it)."""
        self.forwards.append(sink)

    def connect(self, models: Mapping[str, nn.Module], value_names: Sequence[str] = ()) -> None:
        """``handshake_group`` None: a reader of a segment that its writer checked the schema
        for."""
        models = {} if self.header_only else models

        def make_payload() -> Payload:
            return Payload.from_models(models, value_names, self.wire_dtype, self.device)

        if self.group is not None:
            check_schema(
                make_payload().schema,
                group=self.group,
                root=self.publisher_rank,
                who=str(self.endpoint),
                what="weights",
            )
        self.live = Payload.from_models(models, value_names, device=self.device)
        for sink in self.forwards:
            sink.open(make_payload)
        self.before_source()
        self.source.open(make_payload)
        digest_on_arrival = getattr(self.source, "digest_on_arrival", None)
        if self.verify == "every" and digest_on_arrival is not None:
            digest_on_arrival(self.live.schema)  # each piece while the next travels
        lend_live = getattr(self.source, "lend_live", None)
        if not self.forwards and lend_live is not None:
            lend_live(self.live)  # applies point the models at what arrived: no copy
        self.live.bind(models)
        gc.collect()  # the schema check's full-size payload, in reference cycles (see Publisher)

    def _applied(self, header: Header) -> Header:
        assert header.version >= self.version, "versions went backwards"
        if verified(self.verify, header.version):
            # what arrived, digested as it landed; else what the models read now: the live
            # buffer, or the segment slot they alias
            arrived = getattr(self.source, "arrived", None)
            held = (
                arrived[1] if arrived and arrived[0] == header.version else digest(self.live.bound)
            )
            if held != header.digest:
                raise CorruptWeightsError(
                    f"{self.endpoint}: the weights of version {header.version} from "
                    f"{self.upstream} arrived corrupt: their digest is {held:#x}, the sender's "
                    f"{header.digest:#x}. The collector stops rather than act with them; a "
                    "transport or memory fault on this node is the likely cause"
                )
        self.version, self.header = header.version, header
        for sink in self.forwards:
            sink.write(self.live.td["weights"], header)
        return header

    def poll(self) -> Header | None:
        newest = None
        while (header := self._poll_source()) is not None:
            newest = self._applied(header)
        return newest

    def _poll_source(self) -> Header | None:
        try:
            return self.source.poll_into(self.live)
        except SyncError as e:
            raise SyncError(f"{self.endpoint}: {e}") from e

    def wait(self, min_version: int, timeout_s: float | None = None) -> Header:
        wait = Wait(self.timeout_s if timeout_s is None else timeout_s, "sync.timeout_s")
        try:
            self.poll()  # a publisher that died since the last poll ends the wait here, said so
        except CorruptWeightsError:
            raise
        except SyncError as e:
            raise self.wait_error(f"weights version >= {min_version}", wait, e) from e
        while self.version < min_version:
            if self.source.exhausted:
                raise SyncError(
                    f"{self.endpoint} waits for version {min_version} but the publisher stopped at "
                    f"version {self.version}"
                )
            left = wait.remaining
            if left <= 0:
                raise self.wait_error(f"weights version >= {min_version}", wait)
            try:
                header = self.source.wait_into(self.live, left)
            except SyncError as e:
                raise self.wait_error(f"weights version >= {min_version}", wait, e) from e
            self._applied(header)
        return self.current_header()

    def close(self) -> None:
        self.source.close()
        for sink in self.forwards:
            sink.close()
