"""Replay of stacked image observations, each frame stored once (``algo.replay_frames``).

A DQN transition on Atari holds two stacks of 4 frames of 84x84 bytes (obs
and next_obs): 56 KB, so a naive replay of 1M transitions takes 56 GB.
Consecutive stacks of one env share every frame but their newest, and a
transition's next_obs is the next one's obs until the episode ends. Here a
ring of frames holds each frame once, and each transition the positions of
its two stacks' frames; sampling gathers the stacks back.

The sharing is checked, never assumed: a stack is stored by reference only
where it equals, byte for byte, frames already stored (the previous stack
shifted by one, or the previous transition's next_obs); any other stack (an
episode's first, one padded with its reset frame) is stored frame by frame,
and equal neighbouring frames once. So a sample is always bit-identical to
what went in: about 1.05 frames per transition on Atari (7 KB instead of 56),
and more where stacks overlap less.

Rings: transitions of one env's column of a batch are appended in time
order, and each column starts with a stack stored anew, so the oldest frame a
transition needs never decreases along the ring. Before a frame overwrites
one that live transitions need, the oldest transitions are retired; the
replay then holds fewer than ``capacity`` transitions, which ``size`` says.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tensordict import TensorDict

from harness.algos.replay import ReplayBuffer
from harness.algos.transfer import HostToDevice

KEYS = ("obs", "next_obs")  # the stacked fields, stored as frame positions


class FrameReplay:
    """A uniform replay of ``capacity`` transitions whose ``obs`` and ``next_obs`` are stacks of
    frames."""

    def __init__(
        self,
        capacity: int,
        rollout: TensorDict,
        memmap_dir: str | Path | None = None,
        device: torch.device | str = "cpu",
    ):
        """``rollout``: a collector's batch's ``[T, N]`` transitions, for the layout; frames are
        allocated for ``capacity`` transitions of columns ``T`` long, plus room for one column
        stored without any sharing."""
        steps = rollout.shape[0]
        stack = rollout["obs"].shape[2]
        example = rollout[0, 0].exclude(*KEYS)
        for key in KEYS:
            # frame sequence numbers
            example[f"{key}_frames"] = torch.zeros(stack, dtype=torch.int64)
        self.transitions = ReplayBuffer(capacity, example, memmap_dir, device)
        frame_capacity = int(capacity * (1 + stack / steps) * 1.05) + 2 * stack * steps
        frames = TensorDict(frame=rollout["obs"][0, 0, 0]).expand(frame_capacity)
        self.frames = (
            frames.memmap_like(str(Path(memmap_dir) / "frames"))
            if memmap_dir
            else frames.to(device).clone()
        )
        self.capacity, self.frame_capacity, self.stack = capacity, frame_capacity, stack
        self.written = 0  # frames written so far: the next one's sequence number
        self.oldest = torch.zeros(capacity, dtype=torch.int64)  # each transition's oldest frame
        self.tail = 0  # the oldest live transition's slot

    @property
    def size(self) -> int:
        return self.transitions.size

    @property
    def storage(self) -> TensorDict:
        """Both rings, for a look at where they live (:mod:`harness.algos.devices`)."""
        return TensorDict(transitions=self.transitions.storage, frames=self.frames)

    @property
    def nbytes(self) -> int:
        return (
            self.transitions.nbytes
            + self.frames["frame"].numel() * self.frames["frame"].element_size()
        )

    def extend(self, rollout: TensorDict) -> None:
        """Append a batch's ``[T, N]`` transitions, one env's column after another."""
        obs, next_obs = rollout["obs"], rollout["next_obs"]
        # Where a stack is the one before it (obs[t] == next_obs[t - 1]) or that stack shifted by a
        # frame.
        repeats = (obs[1:] == next_obs[:-1]).flatten(2).all(-1)
        shifted = (next_obs[:, :, :-1] == obs[:, :, 1:]).flatten(2).all(-1)
        for env in range(rollout.shape[1]):
            self._extend_column(rollout[:, env], repeats[:, env].tolist(), shifted[:, env].tolist())

    def _extend_column(self, column: TensorDict, repeats: list[bool], shifted: list[bool]) -> None:
        new: list[torch.Tensor] = []  # frames to write, in order
        refs = {key: torch.empty(column.shape[0], self.stack, dtype=torch.int64) for key in KEYS}
        previous: list[int] = []
        for t in range(column.shape[0]):
            obs_refs = previous if t and repeats[t - 1] else self._stack(column["obs"][t], new)
            if shifted[t]:
                new.append(column["next_obs"][t, -1])
                next_refs = [*obs_refs[1:], self.written + len(new) - 1]
            else:
                next_refs = self._stack(column["next_obs"][t], new)
            refs["obs"][t], refs["next_obs"][t], previous = (
                torch.tensor(obs_refs),
                torch.tensor(next_refs),
                next_refs,
            )
        self._retire_before(self.written + len(new) - self.frame_capacity)
        slots = torch.arange(self.written, self.written + len(new)) % self.frame_capacity
        self.frames["frame"][slots.to(self.frames.device)] = torch.stack(new).to(self.frames.device)
        self.written += len(new)
        stored = column.exclude(*KEYS)
        for key in KEYS:
            stored[f"{key}_frames"] = refs[key]
        cursor = self.transitions.cursor
        # the ring wraps over the oldest: they retire
        if self.size + column.shape[0] > self.capacity:
            self._retire(self.size + column.shape[0] - self.capacity)
        self.transitions.extend(stored)
        slots = (cursor + torch.arange(column.shape[0])) % self.capacity
        self.oldest[slots] = torch.minimum(
            refs["obs"].min(1).values, refs["next_obs"].min(1).values
        )

    def _stack(self, stack: torch.Tensor, new: list[torch.Tensor]) -> list[int]:
        """Store ``stack``'s frames (equal neighbours once); their sequence numbers."""
        refs: list[int] = []
        for j, frame in enumerate(stack):
            if not (j and torch.equal(frame, stack[j - 1])):
                new.append(frame)
            refs.append(self.written + len(new) - 1)
        return refs

    def _retire_before(self, seq: int) -> None:
        """Retire the oldest transitions while they need a frame older than ``seq``."""
        count = 0
        while count < self.size and int(self.oldest[(self.tail + count) % self.capacity]) < seq:
            count += 1
        self._retire(count)

    def _retire(self, count: int) -> None:
        self.tail = (self.tail + count) % self.capacity
        self.transitions.size -= count

    def sample_index(
        self, batch_size: int, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """``batch_size`` live transitions' slots, uniform, with replacement, where the replay
        lives: a replay on the GPU draws and offsets them there, with no copy to the host (a sync
        per gradient step)."""
        drawn = self.transitions.sample_index(batch_size, generator)
        return (self.tail + drawn) % self.capacity

    def gather(self, index: torch.Tensor) -> TensorDict:
        """The transitions at ``index``, their stacks rebuilt, where the replay lives."""
        out = self.transitions.storage[index.to(self.transitions.storage.device)]
        for key in KEYS:
            slots = out.pop(f"{key}_frames") % self.frame_capacity
            out[key] = self.frames["frame"][slots.flatten()].reshape(
                *slots.shape, *self.frames["frame"].shape[1:]
            )
        return out

    def take(self, index: torch.Tensor, to_device: HostToDevice) -> TensorDict:
        """The transitions at ``index`` on the trainer's device."""
        sample = self.gather(index)
        return (
            sample
            if sample.device is None or sample.device.type != "cpu"
            else to_device.move(sample)
        )

    def state_dict(self) -> dict:
        """Everything, rings whole: the live transitions and frames are wherever the rings put
        them."""
        return {
            "storage": self.transitions.storage.to_dict(),
            "frames": self.frames["frame"],
            "oldest": self.oldest,
            "rings": torch.tensor([self.tail, self.size, self.transitions.cursor, self.written]),
        }

    @classmethod
    def from_state(
        cls,
        state: dict,
        capacity: int,
        memmap_dir: str | Path | None = None,
        device: torch.device | str = "cpu",
    ) -> FrameReplay:
        """A replay holding ``state`` (``state_dict``'s); its capacity must be the one it was saved
        with."""
        saved = len(state["oldest"])
        if saved != capacity:
            raise ValueError(
                f"the checkpoint's frame replay holds {saved} transitions and this run's "
                f"{capacity}: resume with the same algo.buffer_size and topology.trainers, or "
                "start the replay anew (checkpoint.replay_buffer=false)"
            )
        self = cls.__new__(cls)
        storage = TensorDict(state["storage"], batch_size=[capacity])
        self.transitions = ReplayBuffer(capacity, storage[0], memmap_dir, device)
        self.transitions.storage.update_(storage.to(self.transitions.storage.device))
        frames = TensorDict(frame=state["frames"], batch_size=[len(state["frames"])])
        self.frames = (
            frames.memmap_like(str(Path(memmap_dir) / "frames"))
            if memmap_dir
            else frames.to(device).clone()
        )
        if memmap_dir:
            self.frames.update_(frames)
        self.capacity, self.frame_capacity, self.stack = (
            capacity,
            len(state["frames"]),
            storage["obs_frames"].shape[1],
        )
        self.oldest = state["oldest"].clone()
        self.tail, self.transitions.size, self.transitions.cursor, self.written = (
            int(v) for v in state["rings"]
        )
        return self
