"""A trainer rank: learn, publish weights, checkpoint, log.

Trainer 0 publishes and logs; with several trainers each learns from its own
collectors and their gradients are averaged, so all hold the same weights.
They keep in step: each update they meet (:meth:`Trainer.ready`) with their
batches in hand, and all take the same gradient steps. What drives a trainer
is one of three small loops (:mod:`harness.roles.loops`): sync rounds, async
streaming, or offline gradient steps, which the run's kind picks
(:mod:`harness.roles.kinds`). This class is the
:class:`~harness.roles.loops.TrainerSteps` they drive. The version of the
weights is :meth:`Trainer.publish`'s alone to advance.

A run's clock is its *step*: env frames learned from, or, offline, gradient
steps (the kind's). Its budget, log rows and checkpoints are counted in steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
from tensordict import TensorDict

from harness.algos import Algorithm, algorithm_for
from harness.algos.devices import check_devices
from harness.config import Config
from harness.core import checkpoint
from harness.data.channel import ChannelError
from harness.distributed import signals
from harness.distributed.setup import Groups
from harness.distributed.topology import Layout
from harness.distributed.trainers import any_of, meet
from harness.roles import report
from harness.roles.kinds import RunKind, kind_for
from harness.roles.publication import Publication
from harness.roles.rows import LastUpdate, RowBook, RowClock, open_log
from harness.rundir.state import Progress, TrainerState
from harness.sync import Header

log = logging.getLogger("harness")
# After a stop on a signal, the longest the trainer waits for each collector's goodbye. A peer
# that died (the usual reason torchrun stops a group) never sends one, and torchrun kills ranks that
# have not exited 30 s after its SIGTERM; the checkpoint is written by then, the goodbyes only add
# the last faults to the last row.
GOODBYE_AFTER_A_SIGNAL_S = 10.0


class CheckpointSchedule:
    """When a trainer checkpoints on its own: every ``every`` steps (0: never), counted from the
    step a run starts at; and the step of the newest checkpoint written."""

    def __init__(self, every: int, step: int):
        self.every = every
        self.next = (step // every + 1) * every if every else None
        self.saved_at = -1

    def due(self, step: int) -> bool:
        return self.next is not None and step >= self.next

    def advance(self, step: int) -> None:
        """The checkpoint due at ``step`` was written: the next is ``every`` steps on."""
        self.next = (step // self.every + 1) * self.every


class Trainer:
    """One trainer rank: its algorithm and state, what it publishes, what it logs, when it
    checkpoints; the :class:`~harness.roles.loops.TrainerSteps` a loop drives."""

    def __init__(
        self,
        cfg: Config,
        layout: Layout,
        groups: Optional[Groups],
        run_dir: Path,
        kind: Optional[RunKind] = None,
    ):
        self.cfg, self.layout, self.run_dir = cfg, layout, run_dir
        self.kind = kind if kind is not None else kind_for(cfg)
        torch.manual_seed(cfg.seed)
        spec = cfg.env.spec()
        ddp_group = groups.trainers if groups is not None else None
        # train.py resolves trainer.device from the placement; a Trainer built elsewhere (a test's)
        # keeps "auto" on the CPU.
        device = "cpu" if cfg.trainer.device == "auto" else cfg.trainer.device
        self.algo: Algorithm = algorithm_for(cfg.algo.name, spec)(
            cfg.algo, spec, cfg.collector.total_frames, ddp_group, device=device
        )
        # Built alike above; from here each trainer draws its own samples and noise.
        if layout.rank > 0:
            torch.manual_seed(cfg.seed + layout.rank)
        self.kind.prepare(self.algo)
        keep_replay = cfg.checkpoint.replay_buffer
        self.state = TrainerState(self.algo, Progress(), layout.rank, ddp_group, keep_replay)
        self.devices_checked = False  # after this process's first update (Trainer.learned)
        self._resume()
        self.connected = self.kind.connect(layout, groups, self.algo, self.progress.frames)
        self.publication = Publication(
            self.connected.publisher, self.progress, self.algo, cfg.sync.timeout_s
        )
        logger = None
        if layout.rank == 0:
            logger = open_log(cfg, run_dir, self.kind.total, self.step, self.kind.unit)
            report.warn_frozen_weights(self.algo, self.connected.publisher)
        every = cfg.logger.log_every_frames
        clock = RowClock(self.step, every, self.progress.frames, self.progress.updates)
        self.book = RowBook(logger, clock)
        self.checkpoints = CheckpointSchedule(cfg.checkpoint.every_frames, self.step)
        # This update: a trainer was asked to stop (a signal, or a collector's preempt flag).
        self.asked = False

    @property
    def progress(self) -> Progress:
        return self.state.progress

    @property
    def ddp_group(self) -> Optional[dist.ProcessGroup]:
        """The trainers' group, with several; None with one."""
        return self.state.ddp_group

    @property
    def step(self) -> int:
        return self.kind.step(self.progress)

    @property
    def done(self) -> bool:
        return self.step >= self.kind.total

    @property
    def preempted(self) -> bool:
        """A trainer was asked to stop before the budget was spent."""
        return self.asked and not self.done

    @property
    def stopping(self) -> bool:
        return self.done or self.asked

    @property
    def updates(self) -> int:
        return self.progress.updates

    def _resume(self) -> None:
        """Every trainer loads the run's newest valid checkpoint, or a new run
        checkpoint.init_from's (TrainerState.restore)."""
        cfg = self.cfg
        path = self.state.restore(
            self.run_dir, cfg.checkpoint, cfg.algo.name, cfg.env.id, self.kind
        )
        if path is not None:
            self.report_devices(f"after loading {path.name}")

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
        self.checkpoints.saved_at = self.step
        self.meet(f"to checkpoint at {self.kind.unit} {self.step}")
        version = self.publication.carried()
        state = self.state.state_dict(version)
        if self.layout.rank != 0:
            return None
        wandb_id = self.run_dir / "wandb_id"
        meta = {
            "algo": self.cfg.algo.name,
            "env": self.cfg.env.id,
            "step": self.step,
            "unit": self.kind.unit,
            **vars(self.progress),
            "version": version,
            "wandb_id": wandb_id.read_text().strip() if wandb_id.exists() else None,
        }
        started = time.perf_counter()
        path = checkpoint.save(self.run_dir, state, meta, self.cfg.checkpoint.keep)
        # how long it took, written and synced: a slow disk shows here first
        size = (path / "state.pt").stat().st_size / 2**20
        log.info("checkpoint: %s (%.2f MiB in %.2f s)", path, size, time.perf_counter() - started)
        return path

    def receive(self) -> list[TensorDict]:
        assert self.connected.batches is not None  # an online run's
        since = time.perf_counter()
        batches = self.connected.batches.receive()
        self.book.stats.trainer_wait_s += time.perf_counter() - since
        return batches

    def receive_fresh(self) -> TensorDict:
        """The next batch with no frame more than ``collector.max_policy_lag`` versions old; older
        ones are dropped (and counted). With several trainers the version stands still while one
        waits here (the others wait for it in ``ready``), so a collector's next batch is fresh and
        no trainer waits long."""
        assert self.connected.batches is not None  # an online run's
        since, version = time.perf_counter(), self.progress.version
        while True:
            batch = self.connected.batches.receive_any()
            lag = version - int(batch["rollout", "policy_version"].min())
            if lag <= self.cfg.collector.max_policy_lag:
                self.book.stats.trainer_wait_s += time.perf_counter() - since
                return batch
            self.book.stats.add(batch, version, dropped=True)

    def evaluations(self, wait: bool) -> None:
        assert self.connected.evaluations is not None  # an offline run's
        if wait:
            self.connected.evaluations.wait_for(self.progress.version, self.cfg.dist_timeout_s)
        self.book.evals.add(self.connected.evaluations.take())

    def ready(self, batches: list[TensorDict]) -> None:
        """This update's input is in hand: counted in the statistics (its lag against the newest
        version). With several trainers: wait for the others (a trainer whose collectors are late is
        named after ``dist_timeout_s``) before the update's gradient all-reduces, and agree whether
        any was asked to stop, so that all checkpoint and stop after the same update."""
        for batch in batches:
            self.book.stats.add(batch, self.progress.version)
        asked = signals.requested() or any(float(b["stats", "preempt"]) for b in batches)
        if self.ddp_group is not None:
            where = f"for update {self.progress.updates + 1}"
            asked = any_of(asked, self.ddp_group, self.cfg.dist_timeout_s, where)
        self.asked = asked

    def update(self, batches: list[TensorDict]) -> Mapping[str, torch.Tensor | float]:
        return self.algo.update(batches, self.progress.frames)

    def learned(self, frames: int) -> None:
        """Count an update on ``frames`` new frames (of every trainer)."""
        self.progress.frames += frames
        self.progress.updates += 1
        self.publication.changed = True
        if not self.devices_checked:  # the first update made the optimisers' states and the replay
            self.report_devices("after the first update")
            self.devices_checked = True
        self.book.tick(self.step)

    def end_update(self, metrics: Mapping[str, torch.Tensor | float], sync_ms: float) -> None:
        """The safe point after an update, where every collective between updates runs (with several
        trainers all reach it after the same update): when a checkpoint is due or a trainer was
        asked to stop, a meeting and the checkpoint's gather of RNG states (and replays); when a row
        is due, at each checkpoint and after the last update, a meeting and the statistics'
        all-reduce. Trainer 0 writes the row; the last update's waits for :meth:`run`."""
        due = self.checkpoints.due(self.step)
        if not self.stopping and (due or self.book.clock.due(self.step)):
            # A row also ends where each checkpoint does, before it: a resume drops the rows past
            # its checkpoint, and what they gathered since the row before it would be in none.
            self.write_row(self.make_row(metrics, sync_ms))
        if self.asked or due:
            self.save_checkpoint()
            if due:
                self.checkpoints.advance(self.step)
        if self.preempted and self.layout.rank == 0:
            resume = report.resume_hint(self.run_dir, self.cfg.run_name)
            log.warning(
                "%s at %s %d: checkpoint written. Resume: %s",
                report.stop_reason(),
                self.kind.unit,
                self.step,
                resume,
            )
        if self.stopping:
            self.book.final = LastUpdate(metrics, sync_ms, time.monotonic())  # its row: end()

    def make_row(
        self,
        metrics: Mapping[str, torch.Tensor | float],
        sync_ms: float,
        at: Optional[float] = None,
    ) -> dict[str, float]:
        """This update's row, once every trainer is here: the kind's figures from the statistics
        (summed over the trainers: a collective) and evaluations since the last row, the update's
        metrics, the publish's size and time. ``at``: when the update ended, where the rates end
        (the present if not given)."""
        self.meet(f"to log at {self.kind.unit} {self.step}")
        stats, evals = self.book.take(self.ddp_group)
        waited_s = stats.trainer_wait_s / self.layout.trainers  # a trainer's mean
        frames, updates = self.progress.frames, self.progress.updates
        row = self.kind.row(
            stats, evals, self.book.clock.rates(self.step, frames, updates, waited_s, at)
        )
        row.update(self.publication.row())
        row.update({k: v.item() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()})
        row["sync/ms"] = sync_ms
        return row

    def write_row(self, row: dict[str, float]) -> None:
        """Trainer 0 writes ``row`` with the newest version published and the update count."""
        counts = {"sync/version": self.progress.version, "train/updates": self.progress.updates}
        self.book.write(self.step, {**row, **counts, **self.publication.gap()})

    def header(self, stop: bool = False) -> Header:
        """What travels with the current weights: version, frames, the algorithm's values."""
        return self.publication.header(stop)

    def publish(self, stop: bool = False) -> float:
        """Send the current weights as a new version, if they learned since the last publish
        (:meth:`Publication.publish`). Returns milliseconds."""
        return self.publication.publish(stop)

    def run(self, loop: Callable[[Trainer], None]) -> dict[str, float]:
        """Publish the weights the run starts with, run ``loop`` to the end of the budget (or a
        preemption), then end the run (:meth:`end`); returns trainer 0's last row."""
        try:
            self.publish()
            loop(self)
            self.end()
        finally:
            self.publication.close()
            self.book.close()
        logger = self.book.logger
        if logger is not None:  # the run finished or was stopped: say so, and what comes next
            ended = (self.step, self.kind.total, self.done, self.kind.budget)
            print(report.summary(logger, self.run_dir, self.cfg.run_name, *ended), flush=True)
        return self.book.last

    def end(self) -> None:
        """Save the final weights, stop every collector and take its goodbye, then write the last
        row: the last update's, with the faults reported since (a worker replaced late in the run
        is counted although its batch came too late to learn from) and the kind's ending (an
        online run's scores what it hands over)."""
        if self.done and self.checkpoints.saved_at != self.step:
            self.save_checkpoint()  # the final weights, for evaluation or as a behaviour policy
        self.publish(stop=True)
        short = min(GOODBYE_AFTER_A_SIGNAL_S, self.cfg.dist_timeout_s) if self.preempted else None
        try:
            self.connected.drain(self.book.stats.add_faults, short)  # in flight, the goodbyes
        except ChannelError as e:
            if not self.preempted:
                raise
            log.warning("%s; the run stops on a signal without that collector's goodbye", e)
        finally:  # a collector that never said goodbye costs no row
            self.write_last_row()

    def write_last_row(self) -> None:
        last = self.book.final
        if last is None:  # no update this launch (a resumed run whose budget was already spent)
            return
        row = self.make_row(last.metrics, last.sync_ms, last.at)
        if self.done and self.book.logger is not None:
            row.update(self.kind.ending(self.algo, self.header()))
        self.write_row(row)


def run_trainer(
    cfg: Config,
    layout: Layout,
    groups: Optional[Groups],
    run_dir: Path,
    kind: Optional[RunKind] = None,
) -> dict[str, float]:
    """Train until the budget is spent, in the loop the run's kind calls for; returns trainer 0's
    last metrics row."""
    trainer = Trainer(cfg, layout, groups, run_dir, kind)
    return trainer.run(trainer.kind.loop(layout))
