"""Batches to the trainer's device: once per update, from pinned memory, without blocking.

On a CPU trainer a batch is used where it is. On a GPU, each update's batch
(a replay or dataset sample, PPO's round) is written into one staging
TensorDict in pinned CPU memory, whose leaves share one storage, and that
storage moves with one non-blocking copy: the trainer's CPU goes on to queue
the update's kernels while the bytes travel. Two staging buffers take turns;
before one is written again, a CUDA event says its previous copy has left it.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from harness.core.packing import leaf_tensors


class _Slot:
    """One pinned staging buffer and the CUDA event of the last copy out of it."""

    def __init__(self, cuda: bool):
        self.staging: TensorDictBase | None = None
        # (storage leaf, staging leaf) for sample()
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        # whose leaves ``pairs`` holds; None: a move()'s layout
        self.storage: TensorDictBase | None = None
        self.moved = torch.cuda.Event() if cuda else None

    def reusable(self) -> None:
        """Wait until the last copy out of this buffer is done."""
        if self.moved is not None:
            self.moved.synchronize()


class HostToDevice:
    """Moves batches of one layout to ``device`` through reused pinned staging buffers.

    Two, in turn: the CPU fills one while the other's copy waits behind the
    updates queued before it, so it may run two updates ahead of the GPU, not
    one. ``device`` ``cpu``: nothing moves. Any other device stages (pinned
    memory and events on CUDA only, so the same steps also run here towards
    ``meta``, which the tests use)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.moves = self.device.type != "cpu"
        self._cuda = self.device.type == "cuda"
        self._slots = (_Slot(self._cuda), _Slot(self._cuda))
        self._turn = 0  # the slot the next batch goes into

    @property
    def staging(self) -> TensorDictBase | None:
        """The staging buffer the last batch went through (None before any moved)."""
        return self._slots[self._turn ^ 1].staging

    def _next_slot(self) -> _Slot:
        slot = self._slots[self._turn]
        self._turn ^= 1
        slot.reusable()
        return slot

    def sample(self, storage: TensorDictBase, index: torch.Tensor) -> TensorDict:
        """``storage[index]`` on the device: gathered straight into a staging buffer, then moved. A
        storage already on the device (not in host memory) is indexed there."""
        if not self.moves:
            return storage[index]
        if storage.device is not None and storage.device.type != "cpu":
            return storage[index.to(storage.device)]
        slot = self._next_slot()
        if (
            storage is not slot.storage
            or slot.staging is None
            or slot.staging.shape[0] != index.shape[0]
        ):
            slot.staging, slot.storage = self._pinned(storage[index]), storage
            slot.pairs = list(zip(leaf_tensors(storage), leaf_tensors(slot.staging)))
        else:
            for source, staged in slot.pairs:
                torch.index_select(source, 0, index, out=staged)
        return self._send(slot)

    def move(self, batch: TensorDictBase) -> TensorDict:
        """``batch`` (CPU) on the device, through a staging buffer."""
        if not self.moves:
            return batch  # type: ignore[return-value]  # a TensorDict wherever the trainer made it
        slot = self._next_slot()
        if (
            slot.staging is None
            or slot.staging.batch_size != batch.batch_size
            or slot.storage is not None
        ):
            slot.staging, slot.storage = self._pinned(batch), None
        else:
            slot.staging.copy_(batch)
        return self._send(slot)

    def _pinned(self, batch: TensorDictBase) -> TensorDictBase:
        return batch.consolidate(pin_memory=self._cuda)

    def _send(self, slot: _Slot) -> TensorDict:
        assert slot.staging is not None  # sample() and move() filled it
        moved = slot.staging.to(self.device, non_blocking=True)  # one storage, one copy
        if slot.moved is not None:
            slot.moved.record(torch.cuda.current_stream(self.device))
        # A consolidated TensorDict moves as a locked one; the batch is the update's own (a fresh
        # device copy), and algorithms set entries in it (normalised obs, scaled rewards) as they do
        # on a CPU.
        return moved.unlock_()
