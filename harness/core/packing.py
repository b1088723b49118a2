"""Packed payloads: a TensorDict whose leaves are views into one uint8 buffer.

Weights (the sync schemes) and batches (the data channel) both travel as one
such buffer, so a message is one send and applying it is one copy. The packing
itself is TensorDict's ``consolidate``; this module finds its buffer through
public torch API and adds the schema signature that both ends compare before
they exchange anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar, cast

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def pack(td: TensorDictBase) -> TensorDictBase:
    """A consolidated copy of ``td``: every leaf a view into one uint8 buffer,
    on the leaves' device; ``td`` itself when it is packed already (clone it
    first for a copy). (``consolidate`` alone allocates on ``td.device``,
    which is ``None`` for ``TensorDict.from_module``'s: the CPU. A GPU model
    packed that way would have its parameters moved back to the CPU.)"""
    devices = {t.device for t in leaf_tensors(td)}
    if len(devices) > 1:
        raise ValueError(
            f"pack() needs every tensor on one device; these are on {sorted(map(str, devices))}"
        )
    return td.consolidate(device=devices.pop() if devices else None)


def leaf_tensors(td: TensorDictBase) -> Iterator[torch.Tensor]:
    """``td``'s leaves, nested ones included: tensors (tensordict types them
    as any value a TensorDict can hold)."""
    return cast(Iterator[torch.Tensor], td.values(include_nested=True, leaves_only=True))


def buffer_of(packed: TensorDictBase) -> torch.Tensor:
    """The uint8 buffer behind a packed TensorDict (what goes on the wire).

    ``consolidate`` allocates one storage and places every leaf in it, in
    turn, each padded to 8 bytes. That storage is the buffer: this checks that
    the leaves tile it exactly that way, so that the bytes sent are the bytes
    the leaves view, no more and no fewer.
    """
    if not packed.is_consolidated():
        raise TypeError("buffer_of() needs a TensorDict made by pack()")
    leaves = sorted((t for t in leaf_tensors(packed) if t.numel()), key=torch.Tensor.data_ptr)
    if not leaves:
        raise TypeError("buffer_of() needs a packed TensorDict with at least one non-empty tensor")
    storage = leaves[0].untyped_storage()
    base, end = storage.data_ptr(), 0
    for t in leaves:
        if t.data_ptr() - base != end or not t.is_contiguous():
            raise TypeError(
                "buffer_of(): the leaves do not tile one storage as pack() lays them out"
            )
        end += -(-t.nbytes // 8) * 8
    if end != storage.nbytes():
        raise TypeError(
            f"buffer_of(): the leaves fill {end} bytes of a {storage.nbytes()}-byte storage"
        )
    return _bytes(storage, 0, end)


def _bytes(storage: torch.UntypedStorage, offset: int, nbytes: int) -> torch.Tensor:
    """A uint8 tensor over ``nbytes`` of ``storage`` from ``offset``: no copy."""
    empty = torch.empty(0, dtype=torch.uint8, device=storage.device)
    return empty.set_(storage, offset, (nbytes,))  # type: ignore[call-overload]  # stub lacks stride's default (contiguous)


def schema(td: TensorDictBase) -> list[str]:
    """One ``key shape dtype`` line per leaf, sorted by key: the signature two
    ends compare so that the same bytes mean the same tensors on both."""
    lines = []
    for key, value in td.items(include_nested=True, leaves_only=True):
        name = ".".join(key) if isinstance(key, tuple) else key
        lines.append(f"{name} {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}")
    return sorted(lines)


def first_difference(mine: list[str], theirs: list[str]) -> str:
    """Human-readable description of the first entry where two schemas differ."""
    for a, b in zip(mine, theirs):
        if a != b:
            return f"here '{a}', there '{b}'"
    if len(mine) != len(theirs):
        longer, where = (mine, "here") if len(mine) > len(theirs) else (theirs, "there")
        return f"'{longer[min(len(mine), len(theirs))]}' exists only {where}"
    return "none"


def pack_parameters_(module: ModuleT) -> ModuleT:
    """Move ``module``'s parameters and buffers into one packed buffer, in place.

    Call it before making an optimizer (which holds the parameter objects). A
    publisher whose source is packed like its payload sends the weights with
    one flat copy instead of one copy per tensor, which is what makes
    ``sync=shm`` run near memcpy speed.
    """
    packed = pack(TensorDict.from_module(module).detach().clone())
    packed.to_module(module)
    return module


def flat_region(
    source: TensorDictBase, target: TensorDictBase
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(source bytes, target bytes)`` when every leaf of ``source`` sits in one
    buffer at the same relative offsets, dtypes and shapes as in ``target``, and
    so does every leaf of ``target``: then one flat copy moves them all, also
    from one device to another (a GPU trainer's weights into CPU memory).
    ``None`` otherwise."""
    src = list(leaf_tensors(source))
    dst = list(leaf_tensors(target))
    if not src or len(src) != len(dst):
        return None
    if any(
        a.dtype != b.dtype or a.shape != b.shape or not a.is_contiguous() or not b.is_contiguous()
        for a, b in zip(src, dst)
    ):
        return None
    storage = src[0].untyped_storage()
    if any(t.untyped_storage().data_ptr() != storage.data_ptr() for t in src):
        return None
    if any(
        t.device != dst[0].device
        or t.untyped_storage().data_ptr() != dst[0].untyped_storage().data_ptr()
        for t in dst
    ):
        return None
    base_src, base_dst = src[0].data_ptr(), dst[0].data_ptr()
    if any(a.data_ptr() - base_src != b.data_ptr() - base_dst for a, b in zip(src, dst)):
        return None
    nbytes = max(t.data_ptr() + t.numel() * t.element_size() for t in dst) - base_dst
    dst_storage = dst[0].untyped_storage()
    return _bytes(storage, base_src - storage.data_ptr(), nbytes), _bytes(
        dst_storage, base_dst - dst_storage.data_ptr(), nbytes
    )
