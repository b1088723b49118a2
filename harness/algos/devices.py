"""Where an algorithm's tensors are, read off the tensors themselves.

A config that says ``trainer.device=cuda`` proves nothing: a model packed on
the wrong device, an optimiser state made before a move, or a normaliser left
behind all train (or crash) on the CPU while the layout line says ``cuda:0``.
:func:`misplaced` walks everything an algorithm holds; the trainer runs
:func:`check_devices` after its first update and after a resume, the device
tests run it on ``meta``, and ``harness gpu-check`` reports what it found.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from itertools import chain

import torch
from torch import nn

from harness.algos.base import Algorithm
from harness.algos.offpolicy import OffPolicyAlgorithm
from harness.core.packing import leaf_tensors


def _module_tensors(name: str, module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    for key, tensor in chain(module.named_parameters(), module.named_buffers()):
        yield f"{name}.{key}", tensor


def held_tensors(algo: Algorithm) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor ``algo`` holds, by a name that says where: its modules' parameters and
    buffers (DDP-wrapped ones too), its optimisers' states, loose tensors, and the
    models a publish reads."""
    for name, value in vars(algo).items():
        if isinstance(value, nn.Module):
            yield from _module_tensors(name, value)
        elif isinstance(value, torch.optim.Optimizer):
            # torch keeps the step count of an optimiser that is neither fused nor capturable on the
            # CPU by design (meta's, here: the fused kernel has no meta form), so it is not counted.
            host_step = not (value.defaults.get("fused") or value.defaults.get("capturable"))
            for i, state in enumerate(value.state.values()):
                for key, tensor in state.items():
                    if isinstance(tensor, torch.Tensor) and not (key == "step" and host_step):
                        yield f"{name}.state[{i}].{key}", tensor
        elif isinstance(value, torch.Tensor):
            yield name, value
    for name, module in algo.published_models().items():
        yield from _module_tensors(f"published.{name}", module)


def misplaced(algo: Algorithm) -> list[str]:
    """``name (device)`` of each tensor not on ``algo.device``; the replay is checked against
    ``algo.replay_device`` (RAM, staged to the device per sample, unless it was asked on the
    device)."""
    wrong = [f"{name} ({t.device})" for name, t in held_tensors(algo) if t.device != algo.device]
    if isinstance(algo, OffPolicyAlgorithm) and algo.buffer is not None:
        expected = algo.replay_device.type
        wrong += [
            f"replay ({t.device})"
            for t in leaf_tensors(algo.buffer.storage)
            if t.device.type != expected
        ][:1]
    return wrong


def check_devices(algo: Algorithm) -> str:
    """Raise naming every misplaced tensor; else a summary of where the tensors are
    (``312 tensors on cuda:0``), read from the tensors, for the layout and the GPU check."""
    wrong = misplaced(algo)
    if wrong:
        shown = ", ".join(wrong[:8]) + (f" and {len(wrong) - 8} more" if len(wrong) > 8 else "")
        raise RuntimeError(
            f"{type(algo).__name__} should live on {algo.device}, but {len(wrong)} "
            f"tensors do not: {shown}"
        )
    where = Counter(str(t.device) for _, t in held_tensors(algo))
    return ", ".join(f"{n} tensors on {device}" for device, n in sorted(where.items()))
