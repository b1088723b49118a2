"""Who has reached a point: a roll call in the job's store, so that a wait
that expired can name the ranks it waited for.

An expired Gloo wait says only that it expired. With 32 ranks, "one of ranks
1..31 is gone or stalled" sends the reader through 31 logs. So before such a
wait each rank marks the step it reached (one store write, which awaits no
reply), and the rank whose wait expired reads the others' marks and names the
ones behind. Marks are overwritten, never added: the store holds one key per
rank and roll call, however long the job runs.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch.distributed as dist


def ranks_text(ranks: Iterable[int]) -> str:
    """``[1, 2, 3, 5, 7, 8]`` as ``1-3, 5, 7-8``: readable also for 31 ranks."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


class RollCall:
    """The marks of one roll call (``name``) in ``store``; without a store
    (a single process) nothing is marked and nobody can be named."""

    def __init__(self, store: dist.Store | None, name: str):
        self.store, self.name = store, name

    def mark(self, rank: int, step: int = 0) -> None:
        """``rank`` reached ``step``."""
        if self.store is not None:
            self.store.set(f"{self.name}/{rank}", str(step))

    def behind(self, ranks: Iterable[int], step: int = 0) -> list[int] | None:
        """The ranks of ``ranks`` that did not mark ``step`` (or a later one);
        None when the store cannot tell (none, or gone itself)."""
        if self.store is None:
            return None
        late = []
        try:
            for rank in ranks:
                key = f"{self.name}/{rank}"
                if not self.store.check([key]) or int(self.store.get(key)) < step:
                    late.append(rank)
        except (RuntimeError, dist.DistError, ValueError):
            return None
        return late
