"""A trainer rank: learn, publish weights, checkpoint, log.

Trainer 0 publishes and logs; with several trainers each learns from its own
collectors and their gradients are averaged, so all hold the same weights.
They keep in step: each update they meet (:meth:`Trainer.ready`) with their
batches in hand, and all take the same gradient steps. What drives a trainer
is one of three small loops (:mod:`harness.roles.loops`): sync rounds, async
streaming, or offline gradient steps, chosen by :func:`run_trainer`. This
class is the :class:`~harness.roles.loops.TrainerSteps` they drive. The
version of the weights is :meth:`Trainer.publish`'s alone to advance.

A run's clock is its *step*: env frames learned from, or, offline, gradient
steps. Its budget, log rows and checkpoints are counted in steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Optional, cast

import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from harness.algos import Algorithm, algorithm_for
from harness.algos.devices import check_devices
from harness.algos.offline import OfflineAlgorithm
from harness.collect.envs import env_spec
from harness.config import Config
from harness.core import checkpoint
from harness.data import dataset
from harness.distributed import signals
from harness.distributed.setup import Groups
from harness.distributed.topology import Layout
from harness.distributed.trainers import any_of, meet
from harness.metrics.logger import MetricsLogger
from harness.metrics.stats import EvalStats, RolloutStats
from harness.roles import loops, report
from harness.roles.evaluator import evaluate_final
from harness.roles.rows import RowClock
from harness.roles.sources import connect
from harness.runs.state import Progress, TrainerState
from harness.sync import Header

log = logging.getLogger("harness")


class Trainer:
    def __init__(self, cfg: Config, layout: Layout, groups: Optional[Groups], run_dir: Path):
        self.cfg, self.layout, self.run_dir = cfg, layout, run_dir
        torch.manual_seed(cfg.seed)
        spec = env_spec(cfg.env.id, cfg.env.max_episode_steps)
        self.ddp_group = groups.trainers if groups is not None else None
        # train.py resolves trainer.device from the placement; a Trainer built elsewhere (a test's)
        # keeps "auto" on the CPU.
        device = "cpu" if cfg.trainer.device == "auto" else cfg.trainer.device
        self.algo: Algorithm = algorithm_for(cfg.algo.name, spec)(
            cfg.algo, spec, cfg.collector.total_frames, self.ddp_group, device=device
        )
        if (
            layout.rank > 0
        ):  # built alike above; from here each trainer draws its own samples and noise
            torch.manual_seed(cfg.seed + layout.rank)
        self.offline = self.algo.offline
        self.unit = "gradient_steps" if self.offline else "frames"
        self.total = cfg.algo.gradient_steps if self.offline else cfg.collector.total_frames
        self.normalize: Optional[Callable[[float], Optional[float]]] = (
            None  # offline: return -> normalised score
        )
        if self.offline:
            assert cfg.dataset is not None  # Config refuses an offline algorithm without one
            data, meta = dataset.load(cfg.dataset, cfg.env.id)
            dataset.check_shapes(cfg.dataset, data, spec.obs_shape, spec.action_shape)
            cast(OfflineAlgorithm, self.algo).use_dataset(data)  # offline is OfflineAlgorithm's
            self.normalize = meta.normalized
        self.progress = Progress()
        self.devices_checked = False  # after this process's first update (Trainer.learned)
        self.state = TrainerState(
            self.algo, self.progress, layout.rank, self.ddp_group, cfg.checkpoint.replay_buffer
        )
        self.resumed_from = self._resume()
        self.published = -1  # newest version sent
        self.first_version = self.progress.version  # the run's first publish sends it
        self.changed = (
            False  # the weights learned since the last publish: the next one is a new version
        )
        self.saved_at = -1  # step of the newest checkpoint written
        self.connected = connect(cfg, layout, groups, self.algo, self.progress.frames)
        self.publisher = self.connected.publisher
        self.logger = None
        if layout.rank == 0:
            # What config.yaml holds, interpolations unresolved: no secret reaches wandb either.
            saved = run_dir / "config.yaml"
            config = (
                cast(dict, OmegaConf.to_container(OmegaConf.load(saved), resolve=False))
                if saved.exists()
                else {}
            )
            self.logger = MetricsLogger(
                run_dir, self.total, cfg.logger, config, resume_step=self.step, step=self.unit
            )
            report.warn_frozen_weights(self.algo, self.publisher)
        self.stats = RolloutStats()
        self.eval_stats = EvalStats()
        self.rows = RowClock(
            self.step, cfg.logger.log_every_frames, self.progress.frames, self.progress.updates
        )
        every = cfg.checkpoint.every_frames
        self.next_checkpoint = (self.step // every + 1) * every if every else None
        self.preempted = False
        # this update: a trainer was asked to stop (signal, or a collector's preempt flag)
        self.asked = False
        self.final_row: dict[str, float] | None = (
            None  # the last update's row: run() writes it once the run has ended
        )
        self.last_row: dict[str, float] = {}

    @property
    def step(self) -> int:
        return self.progress.updates if self.offline else self.progress.frames

    @property
    def done(self) -> bool:
        return self.step >= self.total

    @property
    def stopping(self) -> bool:
        return self.done or self.preempted or self.asked

    @property
    def updates(self) -> int:
        return self.progress.updates

    def _resume(self) -> Optional[Path]:
        """Every trainer loads the run's newest valid checkpoint, or a new run
        checkpoint.init_from's (TrainerState.restore)."""
        path = self.state.restore(
            self.run_dir, self.cfg.checkpoint, self.cfg.algo.name, self.cfg.env.id
        )
        if path is not None:
            self.report_devices(f"after loading {path.name}")
        return path

    def report_devices(self, when: str) -> None:
        """Every tensor of the algorithm on its device, read off the tensors (a wrong one raises,
        named)."""
        found = check_devices(self.algo)
        if self.layout.rank == 0:
            log.info("device check %s: rank 0 trainer: %s", when, found)

    def meet(self, where: str) -> None:
        """With several trainers: until all are here (a late one is named)."""
        if self.ddp_group is not None:
            meet(self.ddp_group, self.cfg.dist_timeout_s, where)

    def save_checkpoint(self) -> Optional[Path]:
        """Trainer 0 writes; with several trainers, all take part (RNG states)."""
        self.saved_at = self.step
        self.meet(f"to checkpoint at {self.unit} {self.step}")
        # The version these weights carry: the newest published, or the next if they learned since.
        version = self.progress.version + self.changed
        state = self.state.state_dict(version)
        if self.layout.rank != 0:
            return None
        wandb_id = self.run_dir / "wandb_id"
        meta = {
            "algo": self.cfg.algo.name,
            "env": self.cfg.env.id,
            "step": self.step,
            "unit": self.unit,
            **vars(self.progress),
            "version": version,
            "wandb_id": wandb_id.read_text().strip() if wandb_id.exists() else None,
        }
        path = checkpoint.save(self.run_dir, state, meta, self.cfg.checkpoint.keep)
        log.info("checkpoint: %s", path)
        return path

    def receive(self) -> list[TensorDict]:
        assert self.connected.batches is not None  # an online run's
        since = time.perf_counter()
        batches = self.connected.batches.receive()
        self.stats.trainer_wait_s += time.perf_counter() - since
        return batches

    def receive_fresh(self) -> TensorDict:
        """The next batch with no frame more than ``collector.max_policy_lag`` versions old; older
        ones are dropped (and counted). With several trainers the version stands still while one
        waits here (the others wait for it in ``ready``), so a collector's next batch is fresh and
        no trainer waits long."""
        assert self.connected.batches is not None  # an online run's
        since = time.perf_counter()
        while True:
            batch = self.connected.batches.receive_any()
            if (
                self.progress.version - int(batch["rollout", "policy_version"].min())
                <= self.cfg.collector.max_policy_lag
            ):
                self.stats.trainer_wait_s += time.perf_counter() - since
                return batch
            self.stats.add(batch, self.progress.version, dropped=True)

    def evaluations(self, wait: bool) -> None:
        assert self.connected.evaluations is not None  # an offline run's
        if wait:
            self.connected.evaluations.wait_for(self.progress.version, self.cfg.dist_timeout_s)
        self.eval_stats.add(self.connected.evaluations.take())

    def ready(self, batches: list[TensorDict]) -> None:
        """This update's input is in hand: counted in the statistics (its lag against the newest
        version). With several trainers: wait for the others (a trainer whose collectors are late is
        named after ``dist_timeout_s``) before the update's gradient all-reduces, and agree whether
        any was asked to stop, so that all checkpoint and stop after the same update."""
        for batch in batches:
            self.stats.add(batch, self.progress.version)
        asked = signals.requested() or any(float(b["stats", "preempt"]) for b in batches)
        if self.ddp_group is not None:
            asked = any_of(
                asked,
                self.ddp_group,
                self.cfg.dist_timeout_s,
                f"for update {self.progress.updates + 1}",
            )
        self.asked = asked

    def update(self, batches: list[TensorDict]) -> Mapping[str, torch.Tensor | float]:
        return self.algo.update(batches, self.progress.frames)

    def learned(self, frames: int) -> None:
        """Count an update on ``frames`` new frames (of every trainer)."""
        self.progress.frames += frames
        self.progress.updates += 1
        self.changed = True
        if not self.devices_checked:  # the first update made the optimisers' states and the replay
            self.report_devices("after the first update")
            self.devices_checked = True
        if self.logger is not None:
            self.logger.tick(self.step)

    def end_update(self, metrics: Mapping[str, torch.Tensor | float], sync_ms: float) -> None:
        """The safe point after an update, where every collective between updates runs (with several
        trainers all reach it after the same update): when a checkpoint is due or a trainer was
        asked to stop, a meeting and the checkpoint's gather of RNG states (and replays); when a row
        is due, and after the last update, a meeting and the statistics' all-reduce. Trainer 0
        writes the row; the last update's waits for :meth:`run`."""
        due = self.next_checkpoint is not None and self.step >= self.next_checkpoint
        if self.asked or due:
            self.save_checkpoint()
            if due:
                every = self.cfg.checkpoint.every_frames
                self.next_checkpoint = (self.step // every + 1) * every
        if self.asked and not self.done:
            self.preempted = True
            if self.layout.rank == 0:
                resume = report.resume_hint(self.run_dir, self.cfg.run_name)
                log.warning(
                    "%s at %s %d: checkpoint written. Resume: %s",
                    report.stop_reason(),
                    self.unit,
                    self.step,
                    resume,
                )
        if self.rows.due(self.step) or self.stopping:
            self.meet(f"to log at {self.unit} {self.step}")
            stats, self.stats = (
                self.stats.reduced(self.ddp_group),
                RolloutStats(),
            )  # a collective with several trainers
            evals, self.eval_stats = self.eval_stats, EvalStats()
            row = evals.row(self.normalize) if self.offline else stats.row()
            waited_s = stats.trainer_wait_s / self.layout.trainers  # a trainer's mean
            row.update(
                self.rows.rates(
                    self.step, self.progress.frames, self.progress.updates, self.offline, waited_s
                )
            )
            if self.publisher is not None:
                row["sync/bytes"] = self.publisher.payload_bytes
            row.update(
                {k: v.item() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}
            )
            row["sync/ms"] = sync_ms
            if self.stopping:
                self.final_row = row
            else:
                self.write_row(row)

    def write_row(self, row: dict[str, float]) -> None:
        """Trainer 0 writes ``row`` with the newest version published and the update count."""
        if self.logger is not None:
            self.last_row = {
                **row,
                "sync/version": self.progress.version,
                "train/updates": self.progress.updates,
            }
            self.last_row.update(
                report.version_gap(self.publisher, self.progress.version, self.first_version)
            )
            self.logger.log(self.step, self.last_row)

    def header(self, stop: bool = False) -> Header:
        """What travels with the current weights: version, frames, the algorithm's values."""
        version, frames = self.progress.version, self.progress.frames
        return Header(version, frames, stop, self.algo.values_for_header(frames))

    def publish(self, stop: bool = False) -> float:
        """Send the current weights as a new version, if they learned since the last publish (a
        run's first publish sends the version it starts from); a stop is always news to every scheme
        (shm included), so it always carries a new version. Returns milliseconds."""
        if self.changed or (stop and self.progress.version == self.published):
            self.progress.version += 1
        self.changed = False
        if self.publisher is None:
            return 0.0
        if (
            self.algo.device.type == "cuda"
        ):  # the update's queued kernels end outside the timing: sync/ms is the publish's
            torch.cuda.synchronize(self.algo.device)
        started = time.perf_counter()
        self.publisher.publish(self.header(stop))
        self.published = self.progress.version
        return 1000 * (time.perf_counter() - started)

    def run(self, loop: Callable[[Trainer], None]) -> dict[str, float]:
        """Publish the weights the run starts with, run ``loop`` to the end of the budget (or a
        preemption); then end the run: save the final weights, evaluate them (an online run's
        last row scores what it hands over), stop every collector, write the last row."""
        try:
            self.publish()
            loop(self)
            if self.done and self.saved_at != self.step:
                self.save_checkpoint()  # the final weights, for evaluation or as a behaviour policy
            final = self.final_row
            if (
                final is not None
                and self.done
                and not self.offline
                and self.cfg.eval.every_frames
                and self.logger is not None
            ):
                result = evaluate_final(
                    self.cfg, self.algo, self.header()
                )  # after the rates: its time is not training's
                final["eval/final_return"] = (
                    result.return_sum / result.episodes
                )  # beside eval/return (older weights')
            self.publish(stop=True)
            if final is not None:
                self.write_row(final)
            self.connected.drain()  # batches still in flight, then each collector's goodbye
        finally:
            if self.publisher is not None:
                self.publisher.close()
            if self.logger is not None:
                self.logger.close()
        if self.logger is not None:  # the run finished or was stopped: say so, and what comes next
            report.print_summary(
                self.logger,
                self.run_dir,
                self.cfg.run_name,
                self.step,
                self.total,
                self.done,
                self.offline,
            )
        return self.last_row


def run_trainer(
    cfg: Config, layout: Layout, groups: Optional[Groups], run_dir: Path
) -> dict[str, float]:
    """Train until the budget is spent, in the loop the run's kind calls for; returns trainer 0's
    last metrics row."""
    trainer = Trainer(cfg, layout, groups, run_dir)
    return trainer.run(loops.for_run(cfg, layout, trainer.offline))
