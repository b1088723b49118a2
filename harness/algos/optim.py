"""Optimiser mechanics shared by the algorithms."""

from __future__ import annotations

import torch


def step(optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    """One descent step on ``loss`` for the parameters ``optimizer`` holds."""
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
