"""Uniform replay on preallocated TensorDict storage.

Capacity is in transitions; all memory is allocated at start, so its size is
known (``nbytes``) and never grows. With ``memmap_dir`` the storage is a
memory-mapped TensorDict on disk, for capacities larger than RAM; with
``device`` it lives on a GPU, where sampling moves no bytes between host and
device.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tensordict import TensorDict

from harness.algos.transfer import HostToDevice
from harness.core.packing import leaf_tensors


class ReplayBuffer:
    """Fixed-capacity transitions, oldest overwritten first, sampled uniformly."""

    def __init__(
        self,
        capacity: int,
        transition: TensorDict,
        memmap_dir: str | Path | None = None,
        device: torch.device | str = "cpu",
    ):
        """``transition``: one example transition (batch size ``[]``): its keys,
        shapes and dtypes define the storage, on ``device`` (or on disk in ``memmap_dir``)."""
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        storage = transition.expand(capacity)
        self.storage = (
            storage.memmap_like(str(memmap_dir)) if memmap_dir else storage.to(device).clone()
        )
        self.capacity, self.cursor, self.size = capacity, 0, 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in leaf_tensors(self.storage))

    def extend(self, batch: TensorDict) -> None:
        """Append ``batch`` (batch size ``[n]``), overwriting the oldest when full."""
        n = batch.shape[0]
        if n > self.capacity:
            batch, n = batch[-self.capacity :], self.capacity
        # on a GPU: one copy of the batch; then one or two slices (the second where it wraps),
        # plain copies where an index would gather
        batch = batch.to(self.storage.device)
        first = min(n, self.capacity - self.cursor)
        self.storage[self.cursor : self.cursor + first] = batch[:first]
        if first < n:
            self.storage[: n - first] = batch[first:]
        self.cursor = (self.cursor + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> TensorDict:
        """``batch_size`` transitions drawn uniformly, with replacement."""
        return self.storage[self.sample_index(batch_size, generator)]

    def take(self, index: torch.Tensor, to_device: HostToDevice) -> TensorDict:
        """The transitions at ``index`` (``sample_index``'s) on the trainer's device."""
        return to_device.sample(self.storage, index)

    def sample_index(
        self, batch_size: int, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Where ``sample`` draws from: ``batch_size`` indices, uniform, with replacement,
        on the storage's device (for :class:`~harness.algos.transfer.HostToDevice`)."""
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        device = generator.device if generator is not None else self.storage.device
        return torch.randint(0, self.size, (batch_size,), generator=generator, device=device).to(
            self.storage.device
        )

    def state_dict(self) -> dict:
        """The stored transitions and the write position."""
        return {
            "storage": self.storage[: self.size].to_dict(),
            "cursor": self.cursor,
            "size": self.size,
        }

    @classmethod
    def from_state(
        cls,
        state: dict,
        capacity: int,
        memmap_dir: str | Path | None = None,
        device: torch.device | str = "cpu",
    ) -> ReplayBuffer:
        """A buffer holding ``state`` (``state_dict``'s, from any device), of ``capacity``, on
        ``device``."""
        stored = TensorDict(state["storage"], batch_size=[state["size"]])
        buffer = cls(capacity, stored[0], memmap_dir, device)
        buffer.storage[: state["size"]] = stored.to(buffer.storage.device)
        buffer.cursor, buffer.size = state["cursor"] % capacity, min(state["size"], capacity)
        return buffer
