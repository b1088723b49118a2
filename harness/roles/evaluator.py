"""Offline runs: collectors evaluate, trainers never wait for them.

A collector rank takes the newest published weights, runs ``eval.episodes``
deterministic episodes, sends the result to its trainer (a tiny message on the
data channel), and waits for the next version. On the trainer, a helper thread
receives those messages while the main thread takes gradient steps: Gloo's
point-to-point receives cannot be polled, only waited on.
"""

from __future__ import annotations

import math
import threading
import time

import torch
from tensordict import TensorDict

from harness.algos import ALGOS
from harness.collect.envs import make_vec_env, spec_of
from harness.collect.evaluate import evaluate
from harness.collect.rollout import STATS
from harness.config import Config
from harness.data.channel import BatchReceiver, BatchSender, ChannelError
from harness.distributed import signals
from harness.distributed.setup import Groups
from harness.distributed.topology import Layout
from harness.packing import pack
from harness.sync import WeightSubscriber, make_subscriber

EVAL_SEED = 10_000_000  # evaluation envs' seeds never collide with a training env's


def eval_message() -> TensorDict:
    """One evaluation: the version evaluated, by which rank, and the stats
    fields every data-channel message has (``eval_*``, ``preempt``, ``last``)."""
    stats = TensorDict({k: torch.zeros((), dtype=torch.float64) for k in STATS})
    return pack(TensorDict(stats=stats, version=torch.zeros((), dtype=torch.int64), rank=torch.zeros((), dtype=torch.int64)))


class EvalStats:
    """Evaluations that arrived between two log rows."""

    def __init__(self, normalize=None):
        self.normalize = normalize  # return -> normalised score, or None
        self.episodes = self.return_sum = 0.0
        self.version = -1

    def add(self, results: list[tuple[int, float, float]]) -> None:
        for version, episodes, return_sum in results:
            self.episodes += episodes
            self.return_sum += return_sum
            self.version = max(self.version, version)

    def pop(self, group=None) -> dict[str, float]:  # group: as the trainer's stats; one trainer offline
        if not self.episodes:
            return {}
        ret = self.return_sum / self.episodes
        row = {"eval/return": ret, "eval/episodes": self.episodes, "eval/version": self.version}
        score = self.normalize(ret) if self.normalize else None
        if score is not None:
            row["eval/normalized_score"] = score
        self.__init__(self.normalize)
        return row


def evaluation_setup(cfg: Config, subscriber: WeightSubscriber):
    """``eval.episodes`` envs and a policy that ``subscriber`` keeps current."""
    envs = make_vec_env(cfg.env.id, cfg.eval.episodes, cfg.env.max_episode_steps)
    algo = ALGOS[cfg.algo.name]
    policy = algo.make_policy(cfg.algo, spec_of(envs))
    subscriber.connect({"policy": policy}, algo.header_values)
    return envs, policy


class RemoteEvaluations:
    """Trainer side: collectors' evaluation messages, taken by a helper thread."""

    def __init__(self, receiver: BatchReceiver):
        self.receiver = receiver
        self.cond = threading.Condition()
        self.results: list[tuple[int, float, float]] = []  # (version, episodes, return sum)
        self.newest = {c: -1 for c in receiver.collectors}  # newest version each collector evaluated
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._receive, name="eval-receive", daemon=True)
        self.thread.start()

    def _receive(self) -> None:
        try:
            while len(self.receiver.finished) < len(self.receiver.collectors):
                message = self.receiver.receive_any()
                with self.cond:
                    if not float(message["stats", "last"]):
                        stats, version = message["stats"], int(message["version"])
                        self.results.append((version, float(stats["eval_episodes"]), float(stats["eval_return_sum"])))
                        self.newest[int(message["rank"])] = version
                    self.cond.notify_all()
        except BaseException as e:  # handed to the trainer's thread
            with self.cond:
                self.error = e
                self.cond.notify_all()

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def take(self) -> list[tuple[int, float, float]]:
        """The evaluations that arrived since the last call."""
        with self.cond:
            self._check()
            results, self.results = self.results, []
            return results

    def wait_for(self, version: int, timeout_s: float) -> None:
        """Until every collector evaluated ``version`` or newer."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while min(self.newest.values()) < version:
                self._check()
                if not self.cond.wait(timeout=max(deadline - time.monotonic(), 0)):
                    late = [c for c, v in self.newest.items() if v < version]
                    raise ChannelError(f"collector ranks {late} did not evaluate version {version} within {timeout_s:g} s")
            self._check()

    def drain(self) -> int:
        """After the stop: until every collector said goodbye."""
        self.thread.join(timeout=self.receiver.timeout_s + 5)
        self._check()
        if self.thread.is_alive():
            raise ChannelError("collectors did not finish their last evaluation in time")
        return 0


class InlineEvaluations:
    """World size 1: the trainer's own process evaluates each new version."""

    def __init__(self, cfg: Config, subscriber: WeightSubscriber):
        self.envs, self.policy = evaluation_setup(cfg, subscriber)
        self.subscriber, self.seed = subscriber, cfg.seed + EVAL_SEED

    def take(self) -> list[tuple[int, float, float]]:
        header = self.subscriber.poll()
        if header is None or header.stop:
            return []
        returns = evaluate(self.policy, self.envs, self.seed, header.values)
        return [(header.version, len(returns), sum(returns))]

    def wait_for(self, version: int, timeout_s: float) -> None:
        pass  # take() evaluates every version as soon as it is published

    def drain(self) -> int:
        self.envs.close()
        return 0


def run_evaluator(cfg: Config, layout: Layout, groups: Groups) -> None:
    """A collector rank of an offline run."""
    subscriber = make_subscriber(cfg.sync, layout.rank, groups)
    envs, policy = evaluation_setup(cfg, subscriber)
    message = eval_message()
    sender = BatchSender(groups.data, layout.rank, layout.trainer_of(layout.rank), message, cfg.dist_timeout_s)
    seed = cfg.seed + EVAL_SEED + layout.rank * cfg.eval.episodes  # each collector its own episodes
    try:
        header = subscriber.wait(min_version=0)
        while not header.stop:
            returns = evaluate(policy, envs, seed, header.values)
            message["stats", "eval_episodes"].fill_(len(returns))
            message["stats", "eval_return_sum"].fill_(math.fsum(returns))
            message["stats", "preempt"].fill_(signals.requested())
            message["version"].fill_(header.version)
            message["rank"].fill_(layout.rank)
            sender.send(message, while_waiting=subscriber.poll)
            header = subscriber.wait(min_version=header.version + 1)
        sender.send_last(message)
    finally:
        subscriber.close()
        envs.close()
