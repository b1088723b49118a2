"""Batches to the trainer's device: once per update, from pinned memory, without blocking.

On a CPU trainer a batch is used where it is. On a GPU, each update's batch
(a replay or dataset sample, PPO's round) is written into one staging
TensorDict in pinned CPU memory, whose leaves share one storage, and that
storage moves with one non-blocking copy: the trainer's CPU goes on to queue
the update's kernels while the bytes travel. The staging buffer is reused;
before it is written again, a CUDA event says the previous copy has left it.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from harness.packing import leaf_tensors


class HostToDevice:
    """Moves batches of one layout to ``device`` through a reused pinned staging buffer.

    ``device`` ``cpu``: nothing moves. Any other device stages (pinned memory
    and events on CUDA only, so the same steps also run here towards
    ``meta``, which the tests use)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.moves = self.device.type != "cpu"
        self._cuda = self.device.type == "cuda"
        self.staging: TensorDictBase | None = None  # the pinned staging buffer, once a batch moved
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (storage leaf, staging leaf) for sample()
        self._storage: TensorDictBase | None = None  # whose leaves _pairs holds
        self._moved = torch.cuda.Event() if self._cuda else None  # the last copy out of the staging buffer

    def sample(self, storage: TensorDictBase, index: torch.Tensor) -> TensorDict:
        """``storage[index]`` on the device: gathered straight into the staging
        buffer, then moved. A storage already on the device (not in host memory) is indexed there."""
        if not self.moves:
            return storage[index]
        if storage.device is not None and storage.device.type != "cpu":
            return storage[index.to(storage.device)]
        if storage is not self._storage or self.staging is None or self.staging.shape[0] != index.shape[0]:
            self.staging = self._pinned(storage[index])
            self._storage = storage
            self._pairs = list(zip(leaf_tensors(storage), leaf_tensors(self.staging)))
        else:
            self._reusable()
            for source, staged in self._pairs:
                torch.index_select(source, 0, index, out=staged)
        return self._send(self.staging)

    def move(self, batch: TensorDictBase) -> TensorDict:
        """``batch`` (CPU) on the device, through the staging buffer."""
        if not self.moves:
            return batch  # type: ignore[return-value]  # a TensorDict wherever the trainer made it
        if self.staging is None or self.staging.batch_size != batch.batch_size or self._storage is not None:
            self.staging, self._storage = self._pinned(batch), None
        else:
            self._reusable()
            self.staging.copy_(batch)
        return self._send(self.staging)

    def _pinned(self, batch: TensorDictBase) -> TensorDictBase:
        self._reusable()
        return batch.consolidate(pin_memory=self._cuda)

    def _reusable(self) -> None:
        """Wait until the previous copy out of the staging buffer is done."""
        if self._moved is not None:
            self._moved.synchronize()

    def _send(self, staging: TensorDictBase) -> TensorDict:
        moved = staging.to(self.device, non_blocking=True)  # one storage, one copy
        if self._moved is not None:
            self._moved.record(torch.cuda.current_stream(self.device))
        # A consolidated TensorDict moves as a locked one; the batch is the update's own (a fresh
        # device copy), and algorithms set entries in it (normalised obs, scaled rewards) as they do on a CPU.
        return moved.unlock_()
