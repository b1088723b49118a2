"""A trainer rank: learn from collectors' batches, publish weights, log.

Trainer 0 publishes and logs; with several trainers (sync mode) each learns
from its own collectors and DDP averages their gradients. An offline
algorithm learns from its dataset instead, and its collectors only evaluate.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from tensordict import TensorDict

from harness import checkpoint
from harness.algos import ALGOS, Algorithm
from harness.collect.envs import env_spec
from harness.collect.rollout import RolloutCollector, batch_template
from harness.config import Config
from harness.data import dataset
from harness.data.channel import BatchReceiver
from harness.distributed import signals
from harness.distributed.setup import Groups
from harness.distributed.topology import Layout
from harness.metrics.logger import MetricsLogger
from harness.roles.collector import Evaluator, build_collector, make_evaluator
from harness.roles.evaluator import EvalStats, InlineEvaluations, RemoteEvaluations, eval_message
from harness.sync import Header, WeightPublisher, WeightSubscriber, make_publisher
from harness.sync.local import local_pair

log = logging.getLogger("harness")


class InlineCollector:
    """World size 1: the trainer's own rank collects each batch itself."""

    def __init__(self, collector: RolloutCollector, subscriber: WeightSubscriber, evaluator: Evaluator | None):
        self.collector, self.subscriber, self.evaluator = collector, subscriber, evaluator

    def receive(self) -> list[TensorDict]:
        self.subscriber.poll()
        batch = self.collector.collect(self.subscriber.header)
        if self.evaluator is not None:
            self.evaluator.maybe_run(batch, self.subscriber.header)
        return [batch]

    def receive_any(self) -> TensorDict:
        return self.receive()[0]

    def drain(self) -> int:
        return 0


class Stats:
    """What collectors' batches say, summed between two log rows (and over
    all trainers, whose collectors are disjoint)."""

    SUMS = ("episodes", "return_sum", "length_sum", "eval_episodes", "eval_return_sum")

    def __init__(self):
        self.sums = torch.zeros(len(self.SUMS) + 2, dtype=torch.float64)  # + frames kept, batches dropped
        self.lag = torch.tensor([float("inf"), 0.0, 0.0, float("-inf")], dtype=torch.float64)  # min, sum, n, max

    def add(self, batch: TensorDict, version: int, dropped: bool = False) -> None:
        stats = batch["stats"]
        self.sums[: len(self.SUMS)] += torch.stack([stats[k] for k in self.SUMS])
        if dropped:
            self.sums[-1] += 1
            return
        lag = (version - batch["rollout", "policy_version"]).double()
        self.sums[-2] += lag.numel()
        self.lag[0] = min(self.lag[0], lag.min())
        self.lag[1] += lag.sum()
        self.lag[2] += lag.numel()
        self.lag[3] = max(self.lag[3], lag.max())

    def pop(self, group: dist.ProcessGroup | None) -> dict[str, float]:
        sums, lag = self.sums, self.lag
        if group is not None:
            dist.all_reduce(sums, group=group)
            lo, hi = -lag[0:1], lag[3:4]
            dist.all_reduce(lo, op=dist.ReduceOp.MAX, group=group)
            dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=group)
            mid = lag[1:3].clone()
            dist.all_reduce(mid, group=group)
            lag = torch.cat([-lo, mid, hi])
        episodes, returns, lengths, eval_episodes, eval_returns, _, dropped = sums.tolist()
        row = {
            "train/episode_return": returns / episodes if episodes else float("nan"),
            "train/episode_length": lengths / episodes if episodes else float("nan"),
            "train/episodes": episodes,
            "collect/policy_lag_min": lag[0].item() if lag[2] else float("nan"),
            "collect/policy_lag_mean": (lag[1] / lag[2]).item() if lag[2] else float("nan"),
            "collect/policy_lag_max": lag[3].item() if lag[2] else float("nan"),
            "collect/batches_dropped": dropped,
        }
        if eval_episodes:
            row["eval/return"] = eval_returns / eval_episodes
        self.__init__()
        return row


class Trainer:
    def __init__(self, cfg: Config, layout: Layout, groups: Groups | None, run_dir: Path):
        self.cfg, self.layout = cfg, layout
        torch.manual_seed(cfg.seed)
        spec = env_spec(cfg.env.id, cfg.env.max_episode_steps)
        self.ddp_group = groups.trainers if groups is not None else None
        self.algo: Algorithm = ALGOS[cfg.algo.name](cfg.algo, spec, cfg.collector.total_frames, self.ddp_group)
        self.run_dir = run_dir
        self.offline = self.algo.offline  # then "frames" count gradient steps: there are no env frames
        self.total = cfg.algo.gradient_steps if self.offline else cfg.collector.total_frames
        normalize = None
        if self.offline:
            data, meta = dataset.load(cfg.dataset, cfg.env.id)
            dataset.check_shapes(cfg.dataset, data, spec.obs_shape, spec.action_shape)
            self.algo.use_dataset(data)
            normalize = meta.normalized
        self.frames = self.version = self.updates = 0
        self.published = -1  # newest version sent
        self.saved_frames = -1  # frames of the newest checkpoint written
        self.resumed_from = self._resume() if cfg.checkpoint.resume else None
        self.publisher, self.source = self._connect(groups)
        if layout.single_process and self.frames and not self.offline:
            self.source.collector.reset(cfg.seed + self.frames)  # new episodes, not a replay
        self.logger = None
        if layout.rank == 0:
            config = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
            step = "gradient_steps" if self.offline else "frames"
            self.logger = MetricsLogger(run_dir, self.total, cfg.logger, config, resume_frames=self.frames, step=step)
        self.stats = EvalStats(normalize) if self.offline else Stats()
        self.since = (time.monotonic(), self.frames, self.updates)
        self.next_log = self.frames + cfg.logger.log_every_frames
        every = cfg.checkpoint.every_frames
        self.next_checkpoint = (self.frames // every + 1) * every if every else None
        self.preempted = False
        self.last_row: dict[str, float] = {}

    def _resume(self) -> Path | None:
        """Every trainer loads the newest valid checkpoint of the run directory."""
        found = checkpoint.load_latest(self.run_dir, self.cfg.algo.name, self.cfg.env.id)
        if found is None:
            return None
        state, meta, path = found
        self.algo.load_state_dict(state["algo"])
        if state.get("replay") is not None and hasattr(self.algo, "load_replay_state"):
            self.algo.load_replay_state(state["replay"])
        self.frames, self.updates, self.version = meta["frames"], meta["updates"], meta["version"]
        rng = state["rng"]
        torch.set_rng_state(rng[self.layout.rank] if self.layout.rank < len(rng) else rng[0])
        if self.layout.rank == 0:
            log.info("resumed from %s: frames %d, version %d", path, self.frames, self.version)
        return path

    def save_checkpoint(self) -> Path | None:
        """Trainer 0 writes; with several trainers, all take part (RNG states)."""
        self.saved_frames = self.frames
        rng = [torch.get_rng_state()]
        if self.ddp_group is not None:
            rng = [torch.empty_like(rng[0]) for _ in range(self.layout.trainers)]
            dist.all_gather(rng, torch.get_rng_state(), group=self.ddp_group)
        if self.layout.rank != 0:
            return None
        wandb_id = self.run_dir / "wandb_id"
        meta = {"algo": self.cfg.algo.name, "env": self.cfg.env.id, "frames": self.frames,
                "updates": self.updates, "version": self.version,
                "wandb_id": wandb_id.read_text().strip() if wandb_id.exists() else None}
        state = {"algo": self.algo.state_dict(), "rng": rng}
        if self.cfg.checkpoint.replay_buffer and hasattr(self.algo, "replay_state"):
            state["replay"] = self.algo.replay_state()
        path = checkpoint.save(self.run_dir, state, meta, self.cfg.checkpoint.keep)
        log.info("checkpoint: %s", path)
        return path

    def after_update(self, batches: list[TensorDict]) -> None:
        """The safe point between updates: checkpoint when due or asked to stop."""
        asked = signals.requested() or any(float(b["stats", "preempt"]) for b in batches)
        if self.ddp_group is not None:  # every trainer must agree to checkpoint together
            flag = torch.tensor([float(asked)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.ddp_group)
            asked = bool(flag)
        due = self.next_checkpoint is not None and self.frames >= self.next_checkpoint
        if asked or due:
            self.save_checkpoint()
            if due:
                self.next_checkpoint = (self.frames // self.cfg.checkpoint.every_frames + 1) * self.cfg.checkpoint.every_frames
        if asked and not self.done:
            self.preempted = True
            if self.layout.rank == 0:
                log.warning("preempted at %d frames: checkpoint written; the same command resumes", self.frames)

    def _connect(self, groups: Groups | None) -> tuple[WeightPublisher | None, object]:
        """The weight publisher (trainer 0 only) and the batch source.

        Order matters: every rank connects the sync group first, then the data
        channel, or two ranks could block on each other's second handshake.
        """
        cfg, layout, models = self.cfg, self.layout, self.algo.published_models()
        if layout.single_process:
            publisher, subscriber = local_pair(cfg.sync.timeout_s)
            publisher.connect(models, self.algo.header_values)
            if self.offline:
                return publisher, InlineEvaluations(cfg, subscriber)
            collector = build_collector(cfg, 0, subscriber)
            return publisher, InlineCollector(collector, subscriber, make_evaluator(cfg, layout, collector))
        publisher = None
        if layout.rank == 0:
            publisher = make_publisher(cfg.sync, layout.rank, groups)
            publisher.connect(models, self.algo.header_values)
        if self.offline:
            template = eval_message()
        else:
            steps = cfg.collector.frames_per_batch // cfg.collector.num_envs
            template = batch_template(models["policy"], self.algo.spec.obs_shape, steps, cfg.collector.num_envs, self.algo.needs_next_obs)
        receiver = BatchReceiver(groups.data, layout.rank, layout.collectors_of(layout.rank), template, cfg.dist_timeout_s)
        return publisher, RemoteEvaluations(receiver) if self.offline else receiver

    def publish(self, stop: bool = False) -> float:
        """Send the current weights as ``self.version``; returns milliseconds."""
        if self.publisher is None:
            return 0.0
        started = time.perf_counter()
        self.publisher.publish(Header(self.version, self.frames, stop, self.algo.values_for_header(self.frames)))
        self.published = self.version
        return 1000 * (time.perf_counter() - started)

    @property
    def done(self) -> bool:
        return self.frames >= self.total

    @property
    def stopping(self) -> bool:
        return self.done or self.preempted

    def log(self, metrics: dict[str, float]) -> None:
        if not (self.frames >= self.next_log or self.stopping):
            return
        row = self.stats.pop(self.ddp_group)  # a collective when there are several trainers
        now = time.monotonic()
        if not self.offline:
            row["collect/frames_per_s"] = (self.frames - self.since[1]) / (now - self.since[0])
        row["train/updates_per_s"] = (self.updates - self.since[2]) / (now - self.since[0])
        if self.publisher is not None:
            row["sync/bytes"] = self.publisher.payload_bytes
        self.next_log, self.since = self.frames + self.cfg.logger.log_every_frames, (now, self.frames, self.updates)
        if self.logger is not None:
            self.last_row = {**row, **metrics, "sync/version": self.version, "train/updates": self.updates}
            self.logger.log(self.frames, self.last_row)

    def run(self) -> dict[str, float]:
        try:
            self.publish()  # version 0: the initial weights
            if self.offline:
                self.run_offline()
            elif self.cfg.collector.mode == "async":
                self.run_async()
            else:
                self.run_sync()
            if self.done and self.saved_frames != self.frames:
                self.save_checkpoint()  # the final weights, for evaluation or as a behaviour policy
            if self.version == self.published:
                self.version += 1  # the stop must be news to every scheme, shm included
            self.publish(stop=True)
            self.source.drain()  # batches still in flight, then each collector's goodbye
        finally:
            if self.publisher is not None:
                self.publisher.close()
            if self.logger is not None:
                self.logger.close()
        return self.last_row

    def run_sync(self) -> None:
        """Rounds: every collector's batch of round r was acted with version r
        (r - 1 when pipelined); the trainer learns once per round."""
        pipeline = self.cfg.collector.pipeline
        frames_per_round = self.cfg.collector.frames_per_batch * len(self.layout.collector_ranks or [0])
        sync_ms = 0.0
        rounds = 0
        while not self.stopping:
            batches = self.source.receive()
            rounds += 1
            if pipeline and rounds > 1:
                # Only now that round r is in may version r go out: collectors act on
                # round r + 1 with it while we learn on round r, and no sooner.
                sync_ms = self.publish()
            for batch in batches:
                self.stats.add(batch, self.version)
            metrics = self.algo.update(batches, self.frames)
            self.frames += frames_per_round
            self.updates += 1
            self.version += 1
            self.after_update(batches)
            if not pipeline and not self.stopping:
                sync_ms = self.publish()
            self.log({**metrics, "sync/ms": sync_ms})

    def run_async(self) -> None:
        """Streaming: learn from each batch as it comes, publish every
        ``sync.publish_every_updates`` updates, drop batches with frames more
        than ``collector.max_policy_lag`` versions old."""
        sync_ms, metrics = 0.0, {}
        while not self.stopping:
            batch = self.source.receive_any()
            lag = self.version - int(batch["rollout", "policy_version"].min())
            if lag > self.cfg.collector.max_policy_lag:
                self.stats.add(batch, self.version, dropped=True)
                continue
            self.stats.add(batch, self.version)
            metrics = self.algo.update([batch], self.frames)
            self.frames += batch["rollout"].numel()
            self.updates += 1
            self.after_update([batch])
            if self.updates % self.cfg.sync.publish_every_updates == 0 and not self.stopping:
                self.version += 1
                sync_ms = self.publish()
            self.log({**metrics, "sync/ms": sync_ms})

    def run_offline(self) -> None:
        """Gradient steps on the dataset; publish every ``sync.publish_every_updates``
        steps for the collectors to evaluate; log what they report. The last
        row waits for the final weights' evaluation."""
        sync_ms, metrics = 0.0, {}
        while not self.stopping:
            metrics = self.algo.update([], self.frames)
            self.frames += 1
            self.updates += 1
            self.after_update([])
            if self.updates % self.cfg.sync.publish_every_updates == 0 or self.stopping:
                self.version += 1
                sync_ms = self.publish()
            if self.done:
                self.source.wait_for(self.version, self.cfg.dist_timeout_s)
            self.stats.add(self.source.take())
            self.log({**metrics, "sync/ms": sync_ms})


def run_trainer(cfg: Config, layout: Layout, groups: Groups | None, run_dir: Path) -> dict[str, float]:
    """Train until ``collector.total_frames``; returns trainer 0's last metrics row."""
    return Trainer(cfg, layout, groups, run_dir).run()
