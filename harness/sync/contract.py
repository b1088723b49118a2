"""The weight sync contract that every scheme implements.

Trainer 0 owns a :class:`WeightPublisher`; each collector owns a
:class:`WeightSubscriber`. Every publish carries one
:class:`~harness.sync.payload.Payload`: the weights of one or more models and
a small :class:`Header`, packed into a single buffer. A scheme assembles its
two ends from transports: a :class:`Sink` that a publisher writes to and a
:class:`Source` that a subscriber applies from (see
:mod:`harness.sync.endpoints`).

Guarantees (docs/design.md, "Weight sync schemes: the contract"), which each
scheme's tests prove:

1. Never torn: an update is received into a staging buffer and applied with one
   copy, between env steps, so a collector never acts with a mix of versions.
2. Monotonic: ``poll``/``wait`` never return an older version than before.
3. Bounded: every wait has a timeout; expiry raises :class:`SyncError` naming
   the rank, its role, the scheme and what it waited for.
4. Checked: ``connect`` compares the payload schema on both sides and fails
   with :class:`SchemaMismatchError` naming the first differing key.
5. Cheap: one packed buffer per publish, never one message per tensor, never
   pickled.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from tensordict import TensorDictBase
from torch import nn

from harness.distributed.handshake import SchemaMismatchError
from harness.distributed.setup import Groups
from harness.distributed.topology import Layout
from harness.distributed.waits import Wait
from harness.sync.payload import Header, Payload

PayloadFactory = Callable[[], Payload]  # a fresh payload of the connected layout


class SyncError(RuntimeError):
    """A weight sync wait expired or a peer went away."""


class CorruptWeightsError(SyncError):
    """The weights a collector applied are not the bytes the publisher sent (``sync.verify``)."""


@dataclass(frozen=True)
class Endpoint:
    """Who is talking, for error messages: ``rank 2 (collector, sync=gloo)``."""

    rank: int
    role: str
    scheme: str

    def __str__(self) -> str:
        return f"rank {self.rank} ({self.role}, sync={self.scheme})"


class SyncSettings(Protocol):
    """What the schemes read of the ``sync`` config section
    (:class:`harness.sync.config.SyncConfig`)."""

    @property
    def name(self) -> str: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def late_s(self) -> float: ...
    @property
    def poll_interval_s(self) -> float: ...
    @property
    def torch_wire_dtype(self) -> torch.dtype | None: ...
    @property
    def bucket_bytes(self) -> int: ...
    @property
    def verify(self) -> str: ...


class Scheme(Protocol):
    """A weight sync scheme: a module of ``harness/sync/`` registered in ``SCHEMES``, which
    declares what it needs of the job and assembles its two ends."""

    # Collectors act on a GPU each, to which the weights are delivered (placement gives one per
    # rank).
    gpu_collectors: bool

    def make_groups(self, groups: Groups, layout: Layout, wait_s: float) -> None:
        """Add the process groups of its own to ``groups`` (``groups.scheme_group``,
        ``groups.scheme_pairs``), on every rank, in the same order, right after the job's own
        groups; ``wait_s`` is the longest wait the harness bounds itself on them. Most schemes
        need none (:func:`no_groups`)."""

    def make_publisher(
        self, endpoint: Endpoint, cfg: SyncSettings, groups: Groups
    ) -> WeightPublisher: ...

    def make_subscriber(
        self, endpoint: Endpoint, cfg: SyncSettings, groups: Groups
    ) -> WeightSubscriber: ...


def no_groups(groups: Groups, layout: Layout, wait_s: float) -> None:
    """A scheme's ``make_groups`` when the job's weights group (``groups.sync``) is all it uses."""


@runtime_checkable
class Sink(Protocol):
    """Where a publisher (or a node leader forwarding what it applied) puts
    each update: a broadcast to receivers, a shared-memory segment."""

    def open(self, make_payload: PayloadFactory) -> None:
        """Allocate what the transport needs, once the payload's layout is agreed."""

    def write(self, weights: TensorDictBase, header: Header) -> None:
        """Send ``weights`` (laid out as the payload's ``weights``) stamped with ``header``."""

    def close(self) -> None:
        """Finish what is in flight and release the transport."""


@runtime_checkable
class Source(Protocol):
    """Where a subscriber's updates come from; it applies them into ``live``,
    the payload its models view, only when asked to."""

    @property
    def exhausted(self) -> bool:
        """The publisher sent its stop: nothing more will come."""

    def open(self, make_payload: PayloadFactory) -> None:
        """Allocate staging and start receiving, once the layout is agreed."""

    def poll_into(self, live: Payload) -> Header | None:
        """Apply the next complete update, if one arrived; never blocks."""

    def wait_into(self, live: Payload, timeout_s: float) -> Header:
        """Apply the next update, waiting up to ``timeout_s``; :class:`SyncError` after."""

    def close(self) -> None:
        """Cancel what is pending and release the transport."""


class WeightPublisher(abc.ABC):
    """Trainer 0's side of a scheme."""

    def __init__(self, endpoint: Endpoint, timeout_s: float):
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.payload_bytes = 0  # size of one publish, known after connect

    @property
    def delivers_weights(self) -> bool:
        """False where only the header travels (``sync=none``): collectors keep the weights they
        started with."""
        return True

    @abc.abstractmethod
    def connect(self, models: Mapping[str, nn.Module], value_names: Sequence[str] = ()) -> None:
        """Agree on the payload schema with every subscriber; fails on mismatch."""

    @abc.abstractmethod
    def publish(self, header: Header) -> None:
        """Send the connected models' current weights stamped with ``header``."""

    def close(self) -> None:
        """Finish in-flight sends and release resources."""


class WeightSubscriber(abc.ABC):
    """A collector's side of a scheme."""

    def __init__(self, endpoint: Endpoint, timeout_s: float):
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.version = -1  # newest version applied; -1 before the first
        self.header: Header | None = None  # its header
        self.upstream = "trainer 0"  # who writes what it reads, for error messages

    @abc.abstractmethod
    def connect(self, models: Mapping[str, nn.Module], value_names: Sequence[str] = ()) -> None:
        """Agree on the schema and bind the models' parameters to the live buffer."""

    @abc.abstractmethod
    def poll(self) -> Header | None:
        """Apply the newest complete update, if one arrived; never blocks."""

    @abc.abstractmethod
    def wait(self, min_version: int, timeout_s: float | None = None) -> Header:
        """Block until an update with ``version >= min_version`` is applied."""

    def close(self) -> None:
        """Cancel pending receives and release resources."""

    def current_header(self) -> Header:
        """``header``, once a version was applied (after the first ``wait``): never None then."""
        assert self.header is not None, f"{self.endpoint}: no weights applied yet"
        return self.header

    def wait_error(self, what: str, wait: Wait, cause: BaseException | None = None) -> SyncError:
        """The error for a wait that ended without ``what``: who waited, for what, how
        long it waited and how it ended (``upstream`` gone, or no answer in time)."""
        if wait.ran_out or cause is None:
            return SyncError(
                f"{self.endpoint} waited {wait.seconds:.1f} s for {what} and gave up (newest "
                f"applied version: {self.version}). Is {self.upstream} alive? If it is just slow, "
                "raise sync.timeout_s or publish more "
                "often (sync.publish_every_updates)." + (f" Cause: {cause}" if cause else "")
            )
        return SyncError(
            f"{self.endpoint} stopped waiting for {what}: {wait.ended(cause, self.upstream)} "
            f"(newest applied version: {self.version}). See {self.upstream}'s log. Cause: {cause}"
        )


__all__ = [
    "CorruptWeightsError",
    "Endpoint",
    "Header",
    "PayloadFactory",
    "SchemaMismatchError",
    "Sink",
    "Source",
    "SyncError",
    "WeightPublisher",
    "WeightSubscriber",
]
