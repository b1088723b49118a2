"""The two kinds of run, and all that differs between them, chosen once from the config by
:func:`kind_for`.

An online run (:class:`OnlineRun`) learns from its collectors' frames: its clock counts env
frames, its input is the collectors' batches, its rows hold their statistics and the frame rates,
it ends by evaluating the weights it hands over, and its collector ranks collect. An offline run
(:class:`OfflineRun`) takes gradient steps on a dataset: its clock counts those steps, its
collector ranks only evaluate the published weights, and its rows hold their (normalised) scores.
The trainer (:class:`~harness.roles.trainer.Trainer`) and ``harness.train`` ask their kind what to
do; neither asks which kind it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Optional, Protocol

from harness.algos import ALGOS, Algorithm
from harness.algos.offline import OfflineAlgorithm
from harness.collect.envs import episode_cutoff
from harness.config import Config
from harness.data import dataset
from harness.data.format import DatasetError, Meta
from harness.distributed.setup import Groups
from harness.distributed.topology import Layout
from harness.metrics.stats import EvalStats, RolloutStats
from harness.roles import loops
from harness.roles.collector import run_collector
from harness.roles.evaluator import evaluate_final, run_evaluator
from harness.roles.loops import TrainerSteps
from harness.roles.rows import FRAME_RATES
from harness.roles.sources import Connected, connect_batches, connect_evaluations
from harness.roles.supervisor import run_supervised_collector
from harness.rundir.state import Progress
from harness.sync import Header

log = logging.getLogger("harness")
Loop = Callable[[TrainerSteps], None]
Role = Callable[[Config, Layout, Groups], None]


def reward_normalizer(cfg: Config, meta: Meta) -> float:
    """What ``algo.normalize_reward`` multiplies a dataset's rewards by (1 without it)."""
    if not getattr(cfg.algo, "normalize_reward", False):
        return 1.0
    cutoff = episode_cutoff(cfg.env.id, cfg.env.max_episode_steps)
    if cutoff is None:
        raise DatasetError(
            f"algo.normalize_reward scales by the episode cut-off, and {cfg.env.id} has none: "
            "set env.max_episode_steps"
        )
    return meta.reward_normalizer(cutoff)


class RunKind(Protocol):
    """What the kind of a run decides: :class:`OnlineRun` or :class:`OfflineRun`."""

    unit: str  # the step's name: metrics.csv's first column, a checkpoint's meta
    budget: str  # the setting that sets ``total``: the summary's "train on" line names it
    total: int  # the run's length, in steps

    def step(self, progress: Progress) -> int:
        """Where ``progress`` stands, in ``unit``."""

    def prepare(self, algo: Algorithm) -> None:
        """Before ``algo`` loads a checkpoint: what it learns from, when not collectors' frames."""

    def connect(
        self, layout: Layout, groups: Optional[Groups], algo: Algorithm, frames: int
    ) -> Connected:
        """Trainer 0's publisher and this trainer's input (:mod:`harness.roles.sources`);
        ``frames``: where a resumed run stands."""

    def row(
        self, stats: RolloutStats, evals: EvalStats, rates: dict[str, float]
    ) -> dict[str, float]:
        """A log row's figures, from the statistics (summed over the trainers) and evaluations
        gathered since the last row, and the rates (:class:`~harness.roles.rows.RowClock`'s)."""

    def ending(self, algo: Algorithm, header: Header) -> dict[str, float]:
        """What the last row adds once the budget is spent, measured after its rates (its time
        is not training's)."""

    def loop(self, layout: Layout) -> Loop:
        """What drives the trainer (:mod:`harness.roles.loops`), with its settings read once."""

    @property
    def collector_role(self) -> Role:
        """What a collector rank runs."""


class OnlineRun:
    """Learn from the collectors' frames, for ``collector.total_frames`` of them."""

    unit, budget = "frames", "collector.total_frames"

    def __init__(self, cfg: Config):
        self.cfg, self.total = cfg, cfg.collector.total_frames

    def step(self, progress: Progress) -> int:
        return progress.frames

    def prepare(self, algo: Algorithm) -> None:
        pass  # its input comes with the run

    def connect(
        self, layout: Layout, groups: Optional[Groups], algo: Algorithm, frames: int
    ) -> Connected:
        return connect_batches(self.cfg, layout, groups, algo, frames)

    def row(
        self, stats: RolloutStats, evals: EvalStats, rates: dict[str, float]
    ) -> dict[str, float]:
        return {**stats.row(), **rates}  # the collectors' evaluations come with their batches

    def ending(self, algo: Algorithm, header: Header) -> dict[str, float]:
        """With evaluations on (``eval.every_frames``), the last row scores the weights the run
        hands over: ``eval/final_return``, beside ``eval/return`` (older weights')."""
        if not self.cfg.eval.every_frames:
            return {}
        result = evaluate_final(self.cfg, algo, header)
        return {"eval/final_return": result.return_sum / result.episodes}

    def loop(self, layout: Layout) -> Loop:
        """Async streaming or sync rounds (``collector.mode``)."""
        cfg = self.cfg
        if cfg.collector.mode == "async":
            # On-policy: a round's frames an update, as in sync mode; replay algorithms: each batch
            # as it comes.
            on_policy = ALGOS[cfg.algo.name].on_policy
            per_update = max(len(layout.collectors_of(0)), 1) if on_policy else 1
            every = cfg.sync.publish_every_updates
            return lambda trainer: loops.async_stream(trainer, layout.trainers, every, per_update)
        frames_per_round = cfg.collector.frames_per_batch * max(len(layout.collector_ranks), 1)
        return lambda trainer: loops.sync_rounds(trainer, frames_per_round, cfg.collector.pipeline)

    @property
    def collector_role(self) -> Role:
        """A collector; with ``collector.max_restarts``, one whose envs run in a worker that it
        replaces when it fails."""
        return run_supervised_collector if self.cfg.collector.max_restarts else run_collector


class OfflineRun:
    """Gradient steps on ``dataset=``, ``algo.gradient_steps`` of them; collectors evaluate."""

    unit, budget = "gradient_steps", "algo.gradient_steps"

    def __init__(self, cfg: Config):
        self.cfg, self.total = cfg, cfg.algo.gradient_steps
        # The dataset's score of a return (D4RL's normalised score), where it has one.
        self.normalize: Optional[Callable[[float], Optional[float]]] = None

    def step(self, progress: Progress) -> int:
        return progress.updates  # an update is one gradient step

    def prepare(self, algo: Algorithm) -> None:
        """The dataset, loaded and checked against the env's spaces, for ``algo`` to learn from."""
        path = self.cfg.dataset
        # Config refuses an offline algorithm without a dataset; only offline ones make this kind.
        assert path is not None and isinstance(algo, OfflineAlgorithm)
        data, meta = dataset.load(path, self.cfg.env.id)
        dataset.check_shapes(path, data, algo.spec.obs_shape, algo.spec.action_shape)
        normalizer = reward_normalizer(self.cfg, meta)
        if normalizer != 1.0:
            log.info(
                "rewards times %.4g: CORL's normalize_reward for the dataset's episode returns, "
                "%s (times algo.reward_scale)",
                normalizer,
                meta.return_range,
            )
        algo.use_dataset(data, normalizer)
        self.normalize = meta.normalized

    def connect(
        self, layout: Layout, groups: Optional[Groups], algo: Algorithm, frames: int
    ) -> Connected:
        return connect_evaluations(self.cfg, layout, groups, algo)

    def row(
        self, stats: RolloutStats, evals: EvalStats, rates: dict[str, float]
    ) -> dict[str, float]:
        updates = {k: v for k, v in rates.items() if k not in FRAME_RATES}  # it collects no frames
        return {**evals.row(self.normalize), **updates}

    def ending(self, algo: Algorithm, header: Header) -> dict[str, float]:
        return {}  # its collectors evaluate the final weights: the last row waits for them

    def loop(self, layout: Layout) -> Loop:
        """Gradient steps, publishing for the collectors to evaluate."""
        every = self.cfg.sync.publish_every_updates
        wait_bound_s = min(self.cfg.sync.timeout_s, self.cfg.dist_timeout_s)
        return lambda trainer: loops.offline_steps(trainer, every, wait_bound_s)

    @property
    def collector_role(self) -> Role:
        """An evaluator: each new version's deterministic episodes."""
        return run_evaluator


def kind_for(cfg: Config) -> RunKind:
    """The kind of run ``cfg`` asks for: its algorithm's (``Algorithm.offline``)."""
    return OfflineRun(cfg) if ALGOS[cfg.algo.name].offline else OnlineRun(cfg)
