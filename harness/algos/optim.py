"""Optimiser mechanics shared by the algorithms.

Adam is the fused implementation (one kernel for every parameter's update):
on this project's CPU it measured 0.17 ms a step for twin 256-wide critics,
against 0.59 ms for the for-each and the per-parameter ones (2026-12-01).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch
import torch.distributed as dist

from harness.distributed.trainers import average_gradients


def adam(params: Iterable[torch.Tensor], lr: float, eps: float = 1e-8) -> torch.optim.Adam:
    """Adam (PyTorch's defaults otherwise), fused; on ``meta`` (the device tests), which has no
    fused kernel, the plain one."""
    params = list(params)
    return torch.optim.Adam(
        params, lr=lr, eps=eps, fused=all(p.device.type != "meta" for p in params)
    )


def step(
    optimizer: torch.optim.Optimizer, loss: torch.Tensor, group: dist.ProcessGroup | None = None
) -> None:
    """One descent step on ``loss`` for the parameters ``optimizer`` holds;
    with the trainers' ``group`` (several trainers), on the gradients averaged
    over them, so that every trainer takes the same step.

    Under ``algo.amp`` the losses are computed inside ``torch.autocast``;
    backward, the averaging and the update leave it, as torch advises (backward
    runs each op in the dtype its forward used anyway; the weights stay float32)."""
    optimizer.zero_grad()
    # A device without autocast (``meta``, which the device tests build on) has none to leave.
    amp = torch.amp.is_autocast_available(loss.device.type) and torch.is_autocast_enabled(
        loss.device.type
    )
    with torch.autocast(loss.device.type, enabled=False) if amp else contextlib.nullcontext():
        loss.backward()
        if group is not None:
            average_gradients((p for g in optimizer.param_groups for p in g["params"]), group)
        optimizer.step()
