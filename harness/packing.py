"""Packed payloads: a TensorDict whose leaves are views into one uint8 buffer.

Weights (the sync schemes) and batches (the data channel) both travel as one
such buffer, so a message is one send and applying it is one copy. The packing
itself is TensorDict's ``consolidate``; this module adds the schema signature
that both ends compare before they exchange anything.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase


def pack(td: TensorDictBase) -> TensorDictBase:
    """A consolidated copy of ``td``: every leaf a view into one uint8 buffer."""
    return td.consolidate()


def buffer_of(packed: TensorDictBase) -> torch.Tensor:
    """The uint8 buffer behind a packed TensorDict (what goes on the wire).

    tensordict keeps it in ``_consolidated``; it has no public accessor yet.
    """
    if not packed.is_consolidated():
        raise TypeError("buffer_of() needs a TensorDict made by pack()")
    return packed._consolidated["storage"]


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
