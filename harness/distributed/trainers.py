"""Collectives of the trainers' own group (``topology.trainers`` > 1), whose
failures name the trainer at fault.

A plain Gloo collective that times out says only that it timed out. Trainers
therefore meet at a monitored barrier (Gloo's ``monitored_barrier``: trainer 0
learns which ranks did not come) before each step of a round that waits on
collectors, so that a trainer whose collectors are slow or dead is named by
the others. Once they met, the gradient all-reduces of the round follow
without waiting on anything else; if one still fails (a trainer died
mid-step), the error names the other trainers. Every call is bounded by the
group's timeout (``dist_timeout_s``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import timedelta

import torch
import torch.distributed as dist

from harness.distributed.waits import Wait


class TrainersError(RuntimeError):
    """A trainer did not reach a collective of the trainers' group in time, or died in one."""


def late_ranks(cause: str) -> list[int]:
    """The ranks a failed ``monitored_barrier`` blames: trainer 0 reports the
    ones that did not come, the others report trainer 0 when it did not."""
    missing = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", cause)
    if missing:
        return [int(r) for r in missing.group(1).replace(",", " ").split()]
    waited = re.search(r"send/recv from rank (\d+)", cause)
    return [int(waited.group(1))] if waited else []


def others(group: dist.ProcessGroup) -> list[int]:
    return [r for r in dist.get_process_group_ranks(group) if r != dist.get_rank()]


def meet(group: dist.ProcessGroup, timeout_s: float, where: str) -> None:
    """Return once every trainer of ``group`` reached this point (``where``
    says which, for the error); after ``timeout_s``, fail naming the trainers
    that did not come (or, when one is gone, that it is, as soon as that shows)."""
    wait = Wait(timeout_s, "dist_timeout_s")
    try:
        dist.monitored_barrier(group, timeout=timedelta(seconds=timeout_s), wait_all_ranks=True)
    except RuntimeError as e:
        rank, late = dist.get_rank(), late_ranks(str(e)) or others(group)
        # Only trainer 0 hears from every trainer; the others hear from trainer 0 alone.
        hint = (
            ""
            if rank == 0
            else " (trainer 0 hears from every trainer: its error names the late ones)"
        )
        came = (
            f"did not come within {timeout_s:g} s"
            if wait.ran_out
            else f"did not come: {wait.ended(e)}"
        )
        raise TrainersError(
            f"rank {rank} (trainer) waited for the other trainers {where}: trainer rank(s) {late} "
            f"{came}{hint}. A late trainer stalled or died, or waits on its own collectors (see "
            f"its log and theirs){wait.advice()}. Cause: {e}"
        ) from e


def any_of(flag: bool, group: dist.ProcessGroup, timeout_s: float, where: str) -> bool:
    """Whether ``flag`` holds on any trainer of ``group``; every trainer gets
    the same answer. Meets first (:func:`meet`), so a late trainer is named."""
    meet(group, timeout_s, where)
    value = torch.tensor([float(flag)])
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return bool(value)


def average_gradients(params: Iterable[torch.Tensor], group: dist.ProcessGroup) -> None:
    """Replace each gradient by its mean over the trainers of ``group``: one
    all-reduce of all of them, flattened. Parameters without a gradient are
    left out, alike on every trainer (they run the same step)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    try:
        dist.all_reduce(flat, group=group)
    except RuntimeError as e:
        raise TrainersError(
            f"rank {dist.get_rank()} (trainer): averaging gradients with trainer rank(s) "
            f"{others(group)} failed; one of them died or stalled during a gradient step "
            f"(see its log). Cause: {e}"
        ) from e
    flat /= dist.get_world_size(group)
    for grad, mean in zip(grads, flat.split([g.numel() for g in grads])):
        grad.copy_(mean.view_as(grad))
