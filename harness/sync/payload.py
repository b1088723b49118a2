"""The wire format of a publish: models' weights and a header in one buffer.

Every scheme moves a :class:`Payload`'s :attr:`~Payload.buffer` and nothing
else; the :class:`Header` is the small control block that travels in it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from harness.core.packing import buffer_of, flat_region, leaf_tensors, pack, schema


@dataclass(frozen=True)
class Header:
    """The small control block that travels with every publish."""

    version: int
    frames: int = 0
    stop: bool = False
    values: Mapping[str, float] = field(default_factory=dict)
    # of the weights' bytes (harness.sync.digest), when the collectors verify them (sync.verify)
    digest: int = 0


def weights_of(models: Mapping[str, nn.Module]) -> TensorDict:
    """A TensorDict that references the models' live parameters (no copy)."""
    return TensorDict({name: TensorDict.from_module(m) for name, m in models.items()})


class Payload:
    """Models' weights plus a header, packed into one uint8 buffer.

    ``td`` is ``{"weights": {model: parameters and buffers}, "header":
    {version, frames, stop, digest, values}}``, every leaf a view into ``buffer``.
    Build one with :meth:`from_models`; :meth:`rebase` lays the same leaves
    over another buffer. ``value_names`` are the named floats the header
    carries (DQN's ``epsilon``).
    """

    def __init__(self, td: TensorDictBase, buffer: torch.Tensor, value_names: Sequence[str]):
        self.td = td
        self.buffer = buffer
        self.value_names = tuple(value_names)
        self.schema = schema(td)
        weights = td["weights"]
        # Leaf order, for alias(): a reader points its models at these views.
        self.weight_keys = tuple(weights.keys(include_nested=True, leaves_only=True))
        self.weight_views = tuple(weights[k] for k in self.weight_keys)
        self.bound: tuple[torch.Tensor, ...] = ()  # the models' tensors in leaf order, after bind()
        # write()'s plan for one source: it publishes the same TensorDict every time.
        self._flat_source: TensorDictBase | None = None
        self._flat: tuple[torch.Tensor, torch.Tensor] | None = None
        # PER_LEAF, PLAIN_COPY or DEVICE_TO_HOST, once write() planned it
        self.write_path: str | None = None
        # DEVICE_TO_HOST: recorded after the copy, waited on
        self._copied: torch.cuda.Event | None = None

    @classmethod
    def from_models(
        cls,
        models: Mapping[str, nn.Module],
        value_names: Sequence[str] = (),
        wire_dtype: torch.dtype | None = None,
        device: torch.device | str = "cpu",
        pin: bool = False,
    ) -> Payload:
        """A payload for ``models`` (a name to a module, e.g. ``{"policy":
        actor, "obs_norm": normaliser}``: every parameter and buffer of each
        travels). ``wire_dtype`` stores float32 leaves as, say, bfloat16 to
        halve the bytes; ``device`` and ``pin`` place the buffer (CUDA for
        NCCL, pinned CPU memory to stage a GPU trainer's weights for Gloo)."""
        weights = weights_of(models).detach()
        weights = weights.apply(lambda t: t.to(device=device, dtype=_wire(t.dtype, wire_dtype)))
        header = TensorDict(
            version=torch.zeros((), dtype=torch.int64),
            frames=torch.zeros((), dtype=torch.int64),
            stop=torch.zeros((), dtype=torch.bool),
            digest=torch.zeros((), dtype=torch.int64),
            values=TensorDict({n: torch.zeros((), dtype=torch.float64) for n in value_names}),
            device=device,
        )
        td = TensorDict(weights=weights, header=header, device=device)
        packed = td.consolidate(pin_memory=pin) if pin else pack(td)
        return cls(packed, buffer_of(packed), value_names)

    def rebase(self, buffer: torch.Tensor) -> Payload:
        """The same layout over another uint8 buffer of the same size (a shared
        memory slot, say): writing there needs no staging copy."""
        if buffer.numel() != self.buffer.numel():
            raise ValueError(f"rebase needs {self.buffer.numel()} bytes, got {buffer.numel()}")
        base = self.buffer.data_ptr()

        def view(t: torch.Tensor) -> torch.Tensor:
            start = t.data_ptr() - base
            return buffer[start : start + t.numel() * t.element_size()].view(t.dtype).view(t.shape)

        # apply() is None only when fn returns None for every leaf; view returns a tensor
        return Payload(cast(TensorDictBase, self.td.apply(view)), buffer, self.value_names)

    def bind(self, models: Mapping[str, nn.Module]) -> None:
        """Make the models' parameters views into this payload's buffer, so that
        copying a received buffer into it is the whole apply step."""
        for name, module in models.items():
            self.td["weights", name].to_module(module)
            module.requires_grad_(False)
        bound = weights_of(models)
        self.bound = tuple(bound[k] for k in self.weight_keys)

    def alias(self, other: Payload) -> None:
        """Apply ``other`` (same schema) without copying: point the bound
        models' parameters and buffers at its bytes. They read ``other``'s
        memory from now on, so its owner must keep it unchanged meanwhile."""
        if other.weight_keys != self.weight_keys:
            raise ValueError("alias() needs a payload with the same leaves in the same order")
        for tensor, view in zip(self.bound, other.weight_views):
            tensor.data = view

    def copy_from(self, other: Payload) -> None:
        """Apply a received payload: one flat copy, or per leaf with a cast
        when the wire dtype differs from the live one."""
        if other.buffer.numel() == self.buffer.numel() and other.schema == self.schema:
            self.buffer.copy_(other.buffer, non_blocking=False)
        else:
            self.td.copy_(other.td)

    def write(self, weights: TensorDictBase, header: Header) -> None:
        """Copy ``weights`` (laid out as this payload's) and ``header`` in.

        A source packed like us moves with one flat copy. From a GPU into CPU
        memory (a GPU trainer, CPU collectors) that copy is non-blocking into
        this payload's pinned buffer, and returns only once a CUDA event says
        it landed: a transport sends the buffer right after, and must never
        send bytes still in flight."""
        if weights is not self._flat_source:
            self._flat_source, self._flat = weights, flat_region(weights, self.td["weights"])
            self.write_path = (
                PER_LEAF
                if self._flat is None
                else staging_path(self._flat[0].device, self._flat[1].device)
            )
            self._copied = torch.cuda.Event() if self.write_path == DEVICE_TO_HOST else None
        if self._flat is None:
            # per leaf (a cast to the wire dtype, say); each copy complete when it returns
            self.td["weights"].copy_(weights)
        elif self._copied is None:
            self._flat[1].copy_(self._flat[0])
        else:
            source, target = self._flat
            target.copy_(source, non_blocking=True)
            self._copied.record(torch.cuda.current_stream(source.device))
            self._copied.synchronize()
        self.write_header(header)

    def write_header(self, header: Header) -> None:
        """Stamp ``header``; its values must be the ones declared at connect."""
        stamp(self.td["header"], header, self.value_names)

    def header(self) -> Header:
        """The header in the buffer now."""
        return read_header(self.td["header"], self.value_names)

    @property
    def header_offset(self) -> int:
        """Where the header's bytes start in :attr:`buffer`: after every weight's."""
        base = self.buffer.data_ptr()
        start = min(t.data_ptr() for t in leaf_tensors(self.td["header"])) - base
        assert all(t.data_ptr() - base < start for t in self.weight_views), "header after weights"
        return start

    def pieces(self, bucket_bytes: int) -> list[tuple[int, int]]:
        """The byte ranges of :attr:`buffer` that a transport moves one at a time: the weights in
        pieces of ``bucket_bytes`` (0: all in one), the last one with the header. A version is
        complete only with its last piece."""
        end, size = self.header_offset, self.buffer.numel()
        step = end if bucket_bytes <= 0 else bucket_bytes
        starts = list(range(0, end, max(step, 1))) or [0]
        return [(a, b) for a, b in zip(starts, [*starts[1:], size])]


def stamp(td: TensorDictBase, header: Header, value_names: Sequence[str]) -> None:
    """Write ``header`` into a payload's header TensorDict ``td``."""
    if set(header.values) != set(value_names):
        raise ValueError(
            f"header values {sorted(header.values)} do not match the payload's "
            f"{sorted(value_names)} (declared at connect)"
        )
    td["version"].fill_(header.version)
    td["frames"].fill_(header.frames)
    td["stop"].fill_(header.stop)
    td["digest"].fill_(header.digest)
    for name, value in header.values.items():
        td["values", name].fill_(value)


def read_header(td: TensorDictBase, value_names: Sequence[str]) -> Header:
    """The header in a payload's header TensorDict ``td``."""
    h = td.cpu()
    return Header(
        version=int(h["version"]),
        frames=int(h["frames"]),
        stop=bool(h["stop"]),
        values={n: float(h["values", n]) for n in value_names},
        digest=int(h["digest"]),
    )


PER_LEAF, PLAIN_COPY, DEVICE_TO_HOST = "per leaf", "plain copy", "device to host"


def staging_path(source: torch.device, target: torch.device) -> str:
    """How :meth:`Payload.write` moves a packed source into a buffer on ``target``:
    ``DEVICE_TO_HOST`` from a GPU into CPU memory (one non-blocking copy into
    pinned memory, then a CUDA event waited on); ``PLAIN_COPY`` otherwise:
    CPU to CPU, complete when it returns, or on a GPU (``sync=nccl``), on the
    stream that NCCL's broadcast waits for."""
    return DEVICE_TO_HOST if source.type == "cuda" and target.type == "cpu" else PLAIN_COPY


def _wire(dtype: torch.dtype, wire_dtype: torch.dtype | None) -> torch.dtype:
    return wire_dtype if wire_dtype is not None and dtype == torch.float32 else dtype
