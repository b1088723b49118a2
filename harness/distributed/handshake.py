"""Schema handshake: both ends of a channel prove they mean the same bytes.

Every channel (weights, batches) runs it before it exchanges anything, so its
errors live here, below the channels: :mod:`harness.sync` re-exports them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.core.packing import first_difference


class HandshakeError(RuntimeError):
    """A schema handshake could not complete: a peer is gone or stalled."""


class SchemaMismatchError(HandshakeError):
    """The two ends of a channel disagree on what the bytes mean."""


def check_schema(
    lines: list[str], *, group: dist.ProcessGroup, root: int, who: str, what: str
) -> None:
    """Compare ``lines`` on every member of ``group`` with the root's.

    The root broadcasts its schema; each member compares and all members
    exchange a verdict, so every rank, the root included, fails at start-up
    when any member differs. ``who`` names this rank, ``what`` the channel.
    """
    try:
        text = "\n".join(lines).encode()
        size = torch.tensor([len(text)], dtype=torch.int64)
        dist.broadcast(size, src=root, group=group)
        data = (
            torch.tensor(list(text), dtype=torch.uint8)
            if dist.get_rank() == root
            else torch.empty(int(size), dtype=torch.uint8)
        )
        dist.broadcast(data, src=root, group=group)
        theirs = bytes(data.tolist()).decode().split("\n")
        ok = torch.tensor([int(theirs == lines)], dtype=torch.int64)
        verdicts = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size(group))]
        dist.all_gather(verdicts, ok, group=group)
    except RuntimeError as e:
        raise HandshakeError(f"{who}: the {what} handshake with rank {root} failed: {e}") from e
    members = dist.get_process_group_ranks(group)
    bad = [rank for rank, v in zip(members, verdicts) if not int(v)]
    if not bad:
        return
    if not int(ok):
        raise SchemaMismatchError(
            f"{who}: the {what} schema differs from rank {root}'s; first difference: "
            f"{first_difference(lines, theirs)}. Both ends must run the same "
            "algo, env and model config."
        )
    raise SchemaMismatchError(
        f"{who}: ranks {bad} disagree with rank {root} on the {what} schema (each of them "
        f"names the first differing key). Both ends must run the same algo, env and model config."
    )
