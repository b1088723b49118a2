"""envpool's asynchronous mode (``env.envpool.batch_size`` below ``collector.num_envs``), as
Cleanba and Sebulba step it: the collector acts on whichever ``batch_size`` envs are ready while
envpool's threads step the others, so the policy's forward and the envs' steps overlap.

Envs come back in any order, so a step of env ``i`` is written to env ``i``'s column of the batch
(``[T, N]``, each column one env's consecutive steps, as the learner expects), in the slot after
its previous one. A step is whole when its result comes back: the observation acted on, the
policy's outputs and version, then the reward and ends the next ``recv`` brings. The batch is full
when every env has ``T`` whole steps; an env that got further (it was ready more often) keeps its
extra steps for the next batch, and the actions in flight when a batch ends finish in the next.
So a batch may hold a few steps acted with the previous version, each recorded with its version.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from tensordict import TensorDict

from harness.algos.memory import INITIAL_STATE
from harness.collect.rollout import RolloutCollector
from harness.sync.contract import Header

# a step acted on, awaiting its result: (observation, the policy's outputs, its row there, version)
Acted = tuple[np.ndarray, TensorDict, int, int]


class AsyncRolloutCollector(RolloutCollector):
    """:class:`RolloutCollector` over envpool's ``recv``/``send``
    (:class:`harness.collect.envpool_envs.EnvpoolEnvs` with ``batch_size < num_envs``)."""

    def __init__(self, envs, policy, frames_per_batch, seed, next_obs=False, shared=False):  # type: ignore[no-untyped-def]
        super().__init__(envs, policy, frames_per_batch, seed, next_obs, shared)
        if INITIAL_STATE in self.batch:
            raise ValueError(
                "algo.memory with envpool's asynchronous mode (env.envpool.batch_size > 0): a "
                "recurrent policy needs every env stepped together; set env.envpool.batch_size=0"
            )
        self.next_obs_array = self.batch["next_obs"].numpy()

    def reset(self, seed: int) -> None:
        self.envs.reset(seed=seed)
        self.state = None
        self.pending: list[Acted | None] = [None] * self.num_envs
        # each env's whole steps past the batch that was filling (its column was full)
        self.ahead: list[list[tuple]] = [[] for _ in range(self.num_envs)]

    @torch.no_grad()
    def collect(self, header: Header, refresh: Callable[[], Header] | None = None) -> TensorDict:
        """One batch: every env's next ``T`` whole steps."""
        started, beat, act = time.perf_counter(), self.heartbeat, self.policy.actor()
        for value in self.stats.values():
            value.zero_()
        self.filled = np.zeros(self.num_envs, dtype=np.int64)
        carried, self.ahead = self.ahead, [[] for _ in range(self.num_envs)]
        for i, steps in enumerate(carried):
            for step in steps:
                self._place(i, step)
        while self.filled.min() < self.steps:
            obs, reward, terminated, truncated, info = self.envs.recv()  # type: ignore[attr-defined]
            ids = info["env_id"]
            if beat is not None:
                beat[0] = time.monotonic()
                beat[1] += len(ids)
            for j, i in enumerate(ids.tolist()):
                acted = self.pending[i]
                if acted is not None:
                    self._place(i, (*acted, reward[j], terminated[j], truncated[j], obs[j]))
            if "final_info" in info:
                self._count_finished(info["final_info"])
            if refresh is not None:
                header = refresh()
            out = act(torch.from_numpy(obs), header.values)
            self.envs.send(out["action"].numpy(), ids)  # type: ignore[attr-defined]
            for j, i in enumerate(ids.tolist()):
                self.pending[i] = (obs[j], out, j, header.version)
        self.stats["collect_s"].fill_(time.perf_counter() - started)
        if beat is not None:
            beat[0] = 0.0  # not stepping (see RolloutCollector.collect)
        return self.batch

    def _place(self, i: int, step: tuple) -> None:
        """Env ``i``'s next whole step into its column, or kept for the next batch."""
        t = int(self.filled[i])
        if t == self.steps:
            self.ahead[i].append(step)
            return
        obs, out, j, version, reward, terminated, truncated, next_obs = step
        a = self.arrays
        a["obs"][t, i] = obs
        a["reward"][t, i] = reward
        a["terminated"][t, i] = terminated
        a["truncated"][t, i] = truncated
        a["done"][t, i] = terminated or truncated
        a["policy_version"][t, i] = version
        for key in self.policy_fields:
            self.fields[key][t, i] = out[key][j]
        if "next_obs" in a:
            a["next_obs"][t, i] = next_obs
        if t + 1 == self.steps:  # the observation to bootstrap from
            self.next_obs_array[i] = next_obs
        self.filled[i] = t + 1

    def _count_finished(self, games: dict) -> None:
        """Whole games that ended (:class:`harness.collect.envpool_envs.GameCounter`)."""
        for k in np.flatnonzero(games["_game_return"]):
            self.stats["episodes"].add_(1)
            self.stats["return_sum"].add_(float(games["game_return"][k]))
            self.stats["length_sum"].add_(float(games["game_length"][k]))
