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

from harness.packing import buffer_of, flat_region, pack, schema


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

    ``models`` maps a name to a module (for example ``{"policy": actor,
    "obs_norm": normaliser}``); every parameter and buffer of each travels.
    ``value_names`` are the named floats the header carries (DQN's
    ``epsilon``). ``wire_dtype`` stores float32 leaves as, say, bfloat16 to
    halve the bytes; ``device`` and ``pin`` place the buffer (CUDA for NCCL,
    pinned CPU memory to stage a GPU trainer's weights for Gloo).
    """

    def __init__(
        self,
        models: Mapping[str, nn.Module],
        value_names: Sequence[str] = (),
        wire_dtype: torch.dtype | None = None,
        device: torch.device | str = "cpu",
        pin: bool = False,
    ):
        weights = TensorDict({name: TensorDict.from_module(m) for name, m in models.items()}).detach()
        weights = weights.apply(lambda t: t.to(device=device, dtype=_wire(t.dtype, wire_dtype)))
        header = TensorDict(
            version=torch.zeros((), dtype=torch.int64),
            frames=torch.zeros((), dtype=torch.int64),
            stop=torch.zeros((), dtype=torch.bool),
            values=TensorDict({n: torch.zeros((), dtype=torch.float64) for n in value_names}),
            device=device,
        )
        td = TensorDict(weights=weights, header=header, device=device)
        self.td = td.consolidate(pin_memory=pin) if pin else pack(td)
        self.buffer = buffer_of(self.td)
        self.value_names = tuple(value_names)
        self.schema = schema(self.td)

    def rebase(self, buffer: torch.Tensor) -> "Payload":
        """The same layout over another uint8 buffer of the same size (a shared
        memory slot, say): writing there needs no staging copy."""
        if buffer.numel() != self.buffer.numel():
            raise ValueError(f"rebase needs {self.buffer.numel()} bytes, got {buffer.numel()}")
        base = self.buffer.data_ptr()

        def view(t: torch.Tensor) -> torch.Tensor:
            start = t.data_ptr() - base
            return buffer[start : start + t.numel() * t.element_size()].view(t.dtype).view(t.shape)

        other = object.__new__(Payload)
        other.td, other.buffer = self.td.apply(view), buffer
        other.value_names, other.schema = self.value_names, self.schema
        return other

    def bind(self, models: Mapping[str, nn.Module]) -> None:
        """Make the models' parameters views into this payload's buffer, so that
        copying a received buffer into it is the whole apply step."""
        for name, module in models.items():
            self.td["weights", name].to_module(module)
            module.requires_grad_(False)
        # The models' own tensors, in the payload's leaf order, for alias().
        bound = TensorDict({name: TensorDict.from_module(m) for name, m in models.items()})
        self._keys = list(self.td["weights"].keys(include_nested=True, leaves_only=True))
        self._bound = [bound[k] for k in self._keys]

    def alias(self, other: "Payload") -> None:
        """Apply ``other`` (same schema) without copying: point the bound
        models' parameters and buffers at its bytes. They read ``other``'s
        memory from now on, so its owner must keep it unchanged meanwhile."""
        views = other._views_for(self._keys)
        for tensor, view in zip(self._bound, views):
            tensor.data = view

    def _views_for(self, keys: list) -> list[torch.Tensor]:
        if getattr(self, "_views_keys", None) is not keys:  # looked up once per reader
            self._views_keys, self._views = keys, [self.td["weights"][k] for k in keys]
        return self._views

    def copy_from(self, other: "Payload") -> None:
        """Apply a received payload: one flat copy, or per leaf with a cast
        when the wire dtype differs from the live one."""
        if other.buffer.numel() == self.buffer.numel() and other.schema == self.schema:
            self.buffer.copy_(other.buffer, non_blocking=False)
        else:
            self.td.copy_(other.td)

    def write(self, weights: TensorDict, header: Header) -> None:
        if getattr(self, "_flat_for", None) is not weights:  # decided once per source
            self._flat_for, self._flat = weights, flat_region(weights, self.td["weights"])
        if self._flat is not None:
            self._flat[1].copy_(self._flat[0])  # source packed like us: one copy
        else:
            self.td["weights"].copy_(weights)
        self.write_header(header)

    def write_header(self, header: Header) -> None:
        if set(header.values) != set(self.value_names):
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
        h = self.td["header"].cpu()
        return Header(
            version=int(h["version"]),
            frames=int(h["frames"]),
            stop=bool(h["stop"]),
            values={n: float(h["values", n]) for n in self.value_names},
        )


def _wire(dtype: torch.dtype, wire_dtype: torch.dtype | None) -> torch.dtype:
    return wire_dtype if wire_dtype is not None and dtype == torch.float32 else dtype


def weights_of(models: Mapping[str, nn.Module]) -> TensorDict:
    """A TensorDict that references the models' live parameters (no copy)."""
    return TensorDict({name: TensorDict.from_module(m) for name, m in models.items()})


class WeightPublisher(abc.ABC):
    """Trainer 0's side of a scheme."""

    def __init__(self, endpoint: Endpoint, timeout_s: float):
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.payload_bytes = 0  # size of one publish, known after connect

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
