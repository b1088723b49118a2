"""The weight sync contract that every scheme implements.

Trainer 0 owns a :class:`WeightPublisher`; each collector owns a
:class:`WeightSubscriber`. Every publish carries one :class:`Payload`: the
weights of one or more models and a small header, packed into a single buffer.

Guarantees (``shared/DESIGN.md``), which each scheme's tests prove:

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
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch
from tensordict import TensorDict
from torch import nn

from harness.packing import buffer_of, pack, schema


class SyncError(RuntimeError):
    """A weight sync wait expired or a peer went away."""


class SchemaMismatchError(SyncError):
    """The two ends of a channel disagree on what the bytes mean."""


@dataclass(frozen=True)
class Endpoint:
    """Who is talking, for error messages: ``rank 2 (collector, sync=gloo)``."""

    rank: int
    role: str
    scheme: str

    def __str__(self) -> str:
        return f"rank {self.rank} ({self.role}, sync={self.scheme})"


@dataclass(frozen=True)
class Header:
    """The small control block that travels with every publish."""

    version: int
    frames: int = 0
    stop: bool = False
    values: Mapping[str, float] = field(default_factory=dict)


class Payload:
    """Models' weights plus a header, packed into one uint8 buffer.

    ``models`` maps a name to a module (for example ``{"policy": actor}``);
    every parameter and buffer of each travels. ``value_names`` are the named
    floats the header carries (for example DQN's ``epsilon``).
    """

    def __init__(self, models: Mapping[str, nn.Module], value_names: Sequence[str] = ()):
        weights = TensorDict({name: TensorDict.from_module(m) for name, m in models.items()})
        header = TensorDict(
            version=torch.zeros((), dtype=torch.int64),
            frames=torch.zeros((), dtype=torch.int64),
            stop=torch.zeros((), dtype=torch.bool),
            values=TensorDict({n: torch.zeros((), dtype=torch.float64) for n in value_names}),
        )
        self.td = pack(TensorDict(weights=weights.detach().clone(), header=header))
        self.buffer = buffer_of(self.td)
        self.value_names = tuple(value_names)

    @property
    def schema(self) -> list[str]:
        return schema(self.td)

    def bind(self, models: Mapping[str, nn.Module]) -> None:
        """Make the models' parameters views into this payload's buffer, so that
        copying a received buffer into it is the whole apply step."""
        for name, module in models.items():
            self.td["weights", name].to_module(module)
            module.requires_grad_(False)

    def write(self, weights: TensorDict, header: Header) -> None:
        self.td["weights"].copy_(weights)
        self.write_header(header)

    def write_header(self, header: Header) -> None:
        missing = set(self.value_names) - set(header.values)
        if missing or set(header.values) - set(self.value_names):
            raise ValueError(
                f"header values {sorted(header.values)} do not match the payload's "
                f"{sorted(self.value_names)} (declared at connect)"
            )
        h = self.td["header"]
        h["version"].fill_(header.version)
        h["frames"].fill_(header.frames)
        h["stop"].fill_(header.stop)
        for name, value in header.values.items():
            h["values", name].fill_(value)

    def header(self) -> Header:
        h = self.td["header"]
        return Header(
            version=int(h["version"]),
            frames=int(h["frames"]),
            stop=bool(h["stop"]),
            values={n: float(h["values", n]) for n in self.value_names},
        )


def weights_of(models: Mapping[str, nn.Module]) -> TensorDict:
    """A TensorDict that references the models' live parameters (no copy)."""
    return TensorDict({name: TensorDict.from_module(m) for name, m in models.items()})


class WeightPublisher(abc.ABC):
    """Trainer 0's side of a scheme."""

    def __init__(self, endpoint: Endpoint, timeout_s: float):
        self.endpoint = endpoint
        self.timeout_s = timeout_s

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

    def timeout_error(self, what: str, timeout_s: float, cause: BaseException | None = None) -> SyncError:
        return SyncError(
            f"{self.endpoint} waited {timeout_s:g} s for {what} and gave up "
            f"(newest applied version: {self.version}). Is trainer 0 alive? "
            f"Raise sync.timeout_s if it is just slow."
            + (f" Cause: {cause}" if cause else "")
        )
