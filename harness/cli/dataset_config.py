"""What ``harness dataset`` is asked (``conf/write_dataset.yaml`` composes it): a dataset to write
from rollouts, a mix, a recipe (:mod:`harness.cli.recipe`), or one to verify."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING

from harness.config import EnvConfig

KINDS = ("medium", "medium-replay", "medium-expert")


@dataclass
class StopConfig:
    """Where the behaviour policy stops: the first checkpoint whose stochastic return reaches the
    target. Give one of ``expert_fraction`` and ``target_return``."""

    # the target as a fraction of the way from the random to the expert return (D4RL: about 1/3)
    expert_fraction: Optional[float] = None
    target_return: Optional[float] = None  # the target as a return
    every_frames: int = 10_000  # the candidates: a checkpoint every this many frames
    probe_frames: int = 10_000  # stochastic transitions that measure a candidate's return
    # end the training at the behaviour checkpoint, as D4RL early-stopped its SAC (the checkpoints
    # before it are a whole run's): needs the target before training (target_return, or
    # reference.expert_return), and no medium-expert (its expert is the run's final checkpoint)
    early: bool = False


@dataclass
class RecipeConfig:
    """How a dataset is made, from training to rollouts (module docstring)."""

    name: str = MISSING  # the recipe's name, recorded in meta.json
    kind: str = "medium"  # medium | medium-replay | medium-expert
    preset: str = MISSING  # experiment= of the training run (an off-policy preset: sac_hopper)
    train_frames: int = MISSING  # the training run's frames; its final checkpoint is the expert
    stop: StopConfig = field(default_factory=StopConfig)
    run_dir: str = ""  # the training run's directory (must not exist); "": <out>-run
    overrides: list[str] = field(default_factory=list)  # more key=value for the training run

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"recipe.kind={self.kind!r}: choose one of {', '.join(KINDS)}")
        if (self.stop.expert_fraction is None) == (self.stop.target_return is None):
            raise ValueError(
                "give the recipe's stop criterion as recipe.stop.expert_fraction or "
                "recipe.stop.target_return, one of the two"
            )
        if self.stop.early and self.kind == "medium-expert":
            raise ValueError(
                "recipe.stop.early=true with recipe.kind=medium-expert: the expert is the "
                "training run's final checkpoint, so the run must not stop early"
            )
        if min(self.train_frames, self.stop.every_frames, self.stop.probe_frames) < 1:
            raise ValueError(
                "recipe.train_frames, recipe.stop.every_frames and recipe.stop.probe_frames must "
                "be >= 1"
            )

    @property
    def replay_buffer(self) -> bool:
        """Whether the training run keeps its replay in its checkpoints: medium-replay reads it,
        and an early-stopping recipe keeps it too, so that medium and medium-replay of one run
        have the same command and the second takes the first's checkpoints."""
        return self.kind == "medium-replay" or self.stop.early


@dataclass
class ReferenceConfig:
    """The returns that normalised scores are measured against."""

    episodes: int = 10  # deterministic episodes per measured reference
    # known random return; default: measured with uniform random actions
    random_return: Optional[float] = None
    expert_return: Optional[float] = None  # known expert return, or:
    # a checkpoint or run directory whose policy's return is measured
    expert_policy: Optional[str] = None


@dataclass
class DatasetConfig:
    env: EnvConfig = field(default_factory=EnvConfig)
    out: str = ""  # the dataset directory to write
    # behaviour policy: checkpoint or run directory; None: uniform random actions
    policy: Optional[str] = None
    frames: int = 100_000  # transitions, all ranks together
    num_envs: int = 4  # envs per rank
    # instead of collecting: concatenate these datasets into out
    mix: list[str] = field(default_factory=list)
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    # write by a recipe of conf/recipe/ (recipe=hopper_medium): train, stop, roll out (recipe.py)
    recipe: Optional[RecipeConfig] = None
    verify: Optional[str] = (
        None  # instead of writing: check this dataset's bytes against its digest
    )
    # rank r seeds its envs from seed + r * num_envs onwards, and its policy's sampling with
    # seed + r
    seed: int = 1
    # bounds every collective (the slowest rank's collection included)
    dist_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.frames < 1 or self.num_envs < 1 or self.reference.episodes < 1:
            raise ValueError("frames, num_envs and reference.episodes must be >= 1")
        if self.reference.expert_return is not None and self.reference.expert_policy is not None:
            raise ValueError("give reference.expert_return or reference.expert_policy, not both")
        if not self.out and self.verify is None:
            raise ValueError("give the dataset directory to write: out=DIR")
        if self.recipe is not None and (self.policy is not None or self.mix):
            raise ValueError("a recipe trains its own policy: give recipe= without policy= or mix=")
        stop = self.recipe.stop if self.recipe is not None else StopConfig()
        if stop.early and stop.target_return is None and self.reference.expert_return is None:
            raise ValueError(
                "recipe.stop.early=true stops the training at the first checkpoint that reaches "
                "the target, so the target must be known before training: give "
                "reference.expert_return= (D4RL's REF_MAX_SCORE, say) or recipe.stop.target_return="
            )
