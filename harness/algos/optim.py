"""Optimiser mechanics shared by the algorithms.

Adam is the fused implementation (one kernel for every parameter's update):
on this project's CPU it measured 0.17 ms a step for twin 256-wide critics,
against 0.59 ms for the for-each and the per-parameter ones (2026-12-01).
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist

from harness.distributed.trainers import average_gradients


def adam(params: Iterable[torch.Tensor], lr: float, eps: float = 1e-8) -> torch.optim.Adam:
    """Adam (PyTorch's defaults otherwise), fused."""
    return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)


def step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
    """One descent step on ``loss`` for the parameters ``optimizer`` holds;
    with the trainers' ``group`` (several trainers), on the gradients averaged
    over them, so that every trainer takes the same step."""
    optimizer.zero_grad()
    loss.backward()
    if group is not None:
        average_gradients((p for g in optimizer.param_groups for p in g["params"]), group)
    optimizer.step()
