"""What a trainer checkpoints, as one object with ``state_dict``/``load_state_dict``."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Protocol, cast

import torch
import torch.distributed as dist
from tensordict import TensorDict

from harness.algos import Algorithm, algorithm_for, part_of
from harness.config import Config
from harness.core import checkpoint
from harness.core.checkpoint import CheckpointConfig, CheckpointMismatchError
from harness.core.packing import first_difference

log = logging.getLogger("harness")


@dataclass
class Progress:
    """How far a run got."""

    frames: int = 0  # env frames learned from (none in offline runs)
    updates: int = 0  # algorithm updates: sync rounds, streamed batches, or offline gradient steps
    version: int = 0  # the weights version the next publish carries


class StepClock(Protocol):
    """How a run counts its steps (:class:`~harness.roles.kinds.RunKind` is one)."""

    unit: str  # the step's name: frames, or gradient_steps

    def step(self, progress: Progress) -> int:
        """Where ``progress`` stands, in ``unit``."""


class TrainerState:
    """The algorithm (models and optimisers; with ``keep_replay`` the replay
    buffer), the run's progress, and every trainer's RNG state.

    ``state_dict`` is a collective when several trainers learn together
    (``ddp_group``): each contributes its RNG state and, with ``keep_replay``,
    its own replay buffer (a list, one per trainer), which it gets back on resume.
    """

    def __init__(
        self,
        algo: Algorithm,
        progress: Progress,
        rank: int,
        ddp_group: Optional[dist.ProcessGroup],
        keep_replay: bool,
    ):
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
        leaves = TensorDict(replay["storage"]).items(include_nested=True, leaves_only=True)
        for key, leaf in leaves:
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
        # Saved before checkpoints kept the count: where the updates tell it, take it from them.
        steps = self.algo.gradient_steps_in(self.progress.updates)
        if "gradient_steps" not in state["algo"] and steps is not None:
            self.algo.gradient_steps = steps
        rng = state["rng"]
        torch.set_rng_state(rng[self.rank] if self.rank < len(rng) else rng[0])

    def restore(
        self, run_dir: Path, cfg: CheckpointConfig, algo: str, env_id: str, clock: StepClock
    ) -> Optional[Path]:
        """Where this trainer starts: the run's own newest valid checkpoint (with ``cfg.resume``:
        the run continues), else, in a new run, ``cfg.init_from``'s weights and what
        ``cfg.init_with`` names, with this run's settings, its counters and RNG as a new run's.
        Returns the checkpoint read; ``clock`` says where a resumed run stands."""
        found = checkpoint.load_latest(run_dir, algo, env_id) if cfg.resume else None
        if found is not None:
            state, _, path = found
            self.load_state_dict(state)
            if self.rank == 0:
                step, version = clock.step(self.progress), self.progress.version
                log.info("resumed from %s: %s %d, version %d", path, clock.unit, step, version)
            return path
        if cfg.init_from is None:
            return None
        state, meta, path = checkpoint.load_init(cfg.init_from)
        given, source = state["algo"], f"checkpoint.init_from={cfg.init_from}"
        fresh = self.algo.state_dict()
        self.algo.load_state_dict(initial_state(fresh, given, set(cfg.init_with), source))
        if self.rank == 0:
            at = f"{meta.get('unit', 'frames')} {meta.get('step')}"
            parts = "".join(f", {part}" for part in sorted(cfg.init_with))
            log.info(
                "initialised from %s (algo=%s env=%s at %s): the weights%s; counters start at 0",
                path,
                meta.get("algo"),
                meta.get("env"),
                at,
                parts,
            )
        return path


def mapped_state(step: Path) -> dict | None:
    """A checkpoint's algorithm state with its tensors mapped, not read (the trainer checks their
    bytes against their checksum when it loads them, and skips a damaged checkpoint); None if
    unreadable."""
    try:
        state = torch.load(step / "state.pt", weights_only=True, map_location="cpu", mmap=True)
        return state["algo"]
    except Exception:  # unreadable: the trainer says why, or takes an older one
        return None


def fresh_state(cfg: Config) -> dict:
    """A new run's algorithm state, with ``cfg``'s settings."""
    spec = cfg.env.spec()
    algo = algorithm_for(cfg.algo.name, spec)(cfg.algo, spec, cfg.collector.total_frames)
    return algo.state_dict()


def check_init_from(cfg: Config) -> None:
    """Before anything is written, on every rank: ``checkpoint.init_from``'s networks fit this
    run's, so that a mismatch is one message at start-up."""
    where = Path(cast(str, cfg.checkpoint.init_from))
    if (where / "meta.json").exists():
        step = where
    else:
        step = max(checkpoint.checkpoint_dir(where).glob("step-*"))
    given = mapped_state(step)
    if given is not None:
        source = f"checkpoint.init_from={where}"
        initial_state(fresh_state(cfg), given, set(cfg.checkpoint.init_with), source)


def check_resumes(cfg: Config, step: Path) -> None:
    """Before anything is written, on every rank: the checkpoint a run resumes from holds this run's
    networks (the run's settings are its own, so only another version of the harness writes other
    ones)."""
    given = mapped_state(step)
    if given is not None:
        fix = (
            "Resume it with the harness that wrote it, or use another run_dir= for a new run; "
            "nothing was changed"
        )
        check_fits(fresh_state(cfg), given, {"weights", "normalizer"}, f"checkpoint {step}", fix)


def schema_of(state: dict, parts: set[str]) -> list[str]:
    """``name.key shape dtype`` of every tensor of ``state``'s entries of ``parts``, sorted."""
    return sorted(
        f"{name}.{key} {tuple(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}"
        for name, value in state.items()
        if part_of(name, value) in parts
        for key, tensor in value.items()
        if isinstance(tensor, torch.Tensor)
    )


OTHER_NETWORKS = (
    "Start from a checkpoint of the same algorithm and network sizes, on an env with the same "
    "spaces"
)
OTHER_NORMALIZERS = (
    "Match algo.normalize_obs and algo.normalize_reward to its run's, or leave normalizer out of "
    "checkpoint.init_with"
)


def initial_state(fresh: dict, given: dict, init_with: set[str], source: str) -> dict:
    """A new run's algorithm state (``fresh``) with ``given``'s (a checkpoint's) weights and the
    parts ``init_with`` names. An optimiser keeps ``fresh``'s hyper-parameters (this run's lr) and
    takes ``given``'s moments. Refused, naming the first differing tensor, when the two do not
    fit."""
    loaded = {"weights", *init_with} - {"optimizer"}
    # source: where they come from, as a setting
    check_fits(fresh, given, {"weights"}, source, OTHER_NETWORKS)
    check_fits(fresh, given, loaded, source, OTHER_NORMALIZERS)
    if "optimizer" in init_with:
        fix = "Leave optimizer out of checkpoint.init_with"
        check_fits(fresh, given, {"optimizer"}, source, fix)
    state = dict(fresh)
    for name, value in given.items():
        part = part_of(name, value)
        if part == "optimizer" and part in init_with:
            state[name] = {"state": value["state"], "param_groups": fresh[name]["param_groups"]}
        elif part in loaded:
            state[name] = value
    return state


def check_fits(fresh: dict, given: dict, parts: set[str], source: str, fix: str) -> None:
    """``given``'s entries of ``parts`` have ``fresh``'s names, and their tensors its shapes and
    dtypes (optimisers: their names only, since a new optimiser holds no moments yet)."""
    mine, theirs = schema_of(fresh, parts), schema_of(given, parts)
    if "optimizer" in parts:
        mine, theirs = (
            [f"{n} optimizer" for n, v in side.items() if part_of(n, v) == "optimizer"]
            for side in (fresh, given)
        )
    if sorted(mine) != sorted(theirs):
        first = first_difference(sorted(mine), sorted(theirs))
        raise CheckpointMismatchError(
            f"{source} does not fit this run's {' and '.join(sorted(parts))}: first difference "
            f"(here: this run, there: the checkpoint): {first}. {fix}"
        )
