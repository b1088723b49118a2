"""What a trainer checkpoints, as one object with ``state_dict``/``load_state_dict``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional, cast

import torch
import torch.distributed as dist
from tensordict import TensorDict

from harness.algos import Algorithm


@dataclass
class Progress:
    """How far a run got."""

    frames: int = 0  # env frames learned from (none in offline runs)
    updates: int = 0  # algorithm updates: sync rounds, streamed batches, or offline gradient steps
    version: int = 0  # the weights version the next publish carries


class TrainerState:
    """The algorithm (models and optimisers; with ``keep_replay`` the replay
    buffer), the run's progress, and every trainer's RNG state.

    ``state_dict`` is a collective when several trainers learn together
    (``ddp_group``): each contributes its RNG state and, with ``keep_replay``,
    its own replay buffer (a list, one per trainer), which it gets back on resume.
    """

    def __init__(self, algo: Algorithm, progress: Progress, rank: int, ddp_group: Optional[dist.ProcessGroup], keep_replay: bool):
        self.algo, self.progress, self.rank = algo, progress, rank
        self.ddp_group, self.keep_replay = ddp_group, keep_replay

    def state_dict(self, version: Optional[int] = None) -> dict[str, Any]:
        """``version``: the one the algorithm's weights carry, if not ``progress.version``."""
        rng = [torch.get_rng_state()]
        if self.ddp_group is not None:
            rng = [torch.empty_like(rng[0]) for _ in range(dist.get_world_size(self.ddp_group))]
            dist.all_gather(rng, torch.get_rng_state(), group=self.ddp_group)
        progress = {**asdict(self.progress), **({} if version is None else {"version": version})}
        state: dict[str, Any] = {"algo": self.algo.state_dict(), "progress": progress, "rng": rng}
        if self.keep_replay and hasattr(self.algo, "replay_state"):
            state["replay"] = self.gathered(self.algo.replay_state())
        return state

    def gathered(self, replay: Optional[dict]) -> Optional[dict | list[dict]]:
        """``replay`` (this trainer's buffer) with one trainer; with several,
        every trainer's, on trainer 0. Each trainer stored one batch of the
        same size per update, so every buffer has the same size and layout."""
        if self.ddp_group is None or replay is None:  # None: no batch yet, on any trainer
            return replay
        parts = [TensorDict() for _ in range(dist.get_world_size(self.ddp_group))]
        for key, leaf in TensorDict(replay["storage"]).items(include_nested=True, leaves_only=True):
            tensor = cast(torch.Tensor, leaf)  # a replay's leaves are tensors
            pieces = [torch.empty_like(tensor) for _ in parts] if self.rank == 0 else None
            dist.gather(tensor, pieces, dst=0, group=self.ddp_group)
            for part, piece in zip(parts, pieces or []):
                part[key] = piece
        return [{**replay, "storage": part.to_dict()} for part in parts]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.algo.load_state_dict(state["algo"])
        replay = state.get("replay")
        if replay is not None and hasattr(self.algo, "load_replay_state"):
            self.algo.load_replay_state(replay[self.rank] if isinstance(replay, list) else replay)
        for name, value in state["progress"].items():
            setattr(self.progress, name, value)
        if "gradient_steps" not in state["algo"] and self.algo.offline:  # saved before checkpoints kept the count
            self.algo.gradient_steps = self.progress.updates  # offline, an update is one gradient step
        rng = state["rng"]
        torch.set_rng_state(rng[self.rank] if self.rank < len(rng) else rng[0])
