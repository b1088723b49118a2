"""Stepping envs with the local policy into a preallocated, packed batch.

A batch is one message of the data channel:

- ``rollout`` ``[T, N]``: ``obs`` (as the env returned it, also when the algorithm normalises
  observations: the trainer does that), the policy's outputs (``action``, ...), ``reward``,
  ``terminated``, ``truncated``, ``done`` and the ``policy_version`` that chose each action;
- ``next_obs`` ``[N]``: the observation after the last step, to bootstrap from;
- ``initial_state`` ``[N, S]``, for a policy with memory (:mod:`harness.algos.memory`): each env's
  recurrent state before the batch's first step (zero where an episode starts there);
- ``stats``: episodes finished in this batch with the sum of their returns and lengths; evaluation
  episodes run since the last batch; envs that failed (raised, or returned an observation that does
  not fit) and were made again (:class:`harness.collect.envs.RestartingEnv`: their broken episode
  ends as a truncation and is not counted); ``preempt`` (1 when the collector got
  SIGTERM/SIGUSR1); ``last`` (1 on the collector's final message, which carries no frames);
  ``collect_s``, the seconds this batch's steps took, and ``wait_s``, the seconds the collector
  waited before them (for the trainer to take its previous batch, or for the next version);
  ``collector_restarts`` and ``frames_lost``: worker processes of this collector replaced since
  its previous batch, and the frames their unfinished batches held
  (:mod:`harness.roles.supervisor`); ``joined``: 1 on the batches of a collector that joined the
  running job (:mod:`harness.cli.join`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from harness.algos.base import Policy
from harness.algos.memory import INITIAL_STATE, STATE
from harness.collect.envs import reports_games, spec_of, to_tensor
from harness.core.packing import buffer_of, pack
from harness.sync.contract import Header

STATS = (
    "episodes",
    "return_sum",
    "length_sum",
    "eval_episodes",
    "eval_return_sum",
    "eval_return_sq_sum",
    "eval_distance_episodes",
    "eval_distance_sum",
    "env_restarts",
    "preempt",
    "last",
    "collect_s",
    "wait_s",
    "collector_restarts",
    "frames_lost",
    "joined",
)


def batch_template(
    policy: Policy,
    obs_shape: tuple[int, ...],
    steps: int,
    num_envs: int,
    next_obs: bool = False,
    obs_dtype: str = "float32",
) -> TensorDict:
    """A packed, zero-filled batch. Collectors and trainers both build it from
    the config (the policy's outputs on a dummy observation give the extra
    fields), so the layout is known on both ends before any frame exists.
    ``next_obs``: also store each frame's next observation (the true final
    one at an episode's end), as replay-based algorithms need. A policy with
    memory returns its state after each step: the batch holds it once, as each
    env's ``initial_state``, not per frame."""
    # images stay uint8 up to the trainer's network
    obs = torch.zeros(num_envs, *obs_shape, dtype=getattr(torch, obs_dtype))
    with torch.no_grad():
        out = policy.act(obs)
    state = out.pop(STATE) if STATE in out else None
    frame = out.clone().update(
        {
            "obs": obs,
            "reward": torch.zeros(num_envs),
            "terminated": torch.zeros(num_envs, dtype=torch.bool),
            "truncated": torch.zeros(num_envs, dtype=torch.bool),
            "done": torch.zeros(num_envs, dtype=torch.bool),
            "policy_version": torch.zeros(num_envs, dtype=torch.int64),
        }
    )
    if next_obs:
        frame["next_obs"] = obs.clone()
    stats = TensorDict({k: torch.zeros((), dtype=torch.float64) for k in STATS})
    batch = TensorDict(
        rollout=frame.expand(steps, num_envs).clone(), next_obs=obs.clone(), stats=stats
    )
    if state is not None:
        batch[INITIAL_STATE] = state.clone()
    return pack(batch.zero_())


class RolloutCollector:
    """Steps ``envs`` with ``policy`` and fills one packed batch per call.

    The batch is reused: it is valid until the next ``collect``. ``shared``:
    it lives in shared memory, for another process to send. A policy with
    memory acts from each env's state, carried from step to step and zeroed
    where an episode ended (or the envs were reset); each batch records the
    states its first step started from.
    """

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        policy: Policy,
        frames_per_batch: int,
        seed: int,
        next_obs: bool = False,
        shared: bool = False,
    ):
        self.envs, self.policy = envs, policy
        self.num_envs = envs.num_envs
        if frames_per_batch % self.num_envs:
            raise ValueError(
                f"collector.frames_per_batch={frames_per_batch} must be a multiple of "
                f"collector.num_envs={self.num_envs}"
            )
        self.steps = frames_per_batch // self.num_envs
        obs_space, act_space = envs.single_observation_space, envs.single_action_space
        # a Box: spec_of refuses other observation spaces at start-up
        assert obs_space.shape is not None
        self.batch = batch_template(
            policy, obs_space.shape, self.steps, self.num_envs, next_obs, spec_of(envs).obs_dtype
        )
        if shared:  # in shared memory (another process sends it), before any view of it is taken
            buffer_of(self.batch).share_memory_()
        # Per-field tensors and numpy views of them, looked up once: the step
        # loop then only copies (numpy item assignment is the cheapest there is).
        self.fields = dict(self.batch["rollout"].items())
        self.arrays = {k: v.numpy() for k, v in self.fields.items()}
        env_fields = (
            "obs",
            "next_obs",
            "reward",
            "terminated",
            "truncated",
            "done",
            "policy_version",
        )
        self.policy_fields = [k for k in self.fields if k not in env_fields]
        self.stats = {k: self.batch["stats", k] for k in STATS}
        # (row, return) of each episode that ended in the last batch, row its last step's index in
        # the rollout flattened ([steps, envs]): a dataset cut short counts only its own episodes
        self.ended_returns: list[tuple[int, float]] = []
        self.clip = (
            (act_space.low, act_space.high) if isinstance(act_space, gym.spaces.Box) else None
        )
        # Atari: count whole games (raw returns), not the learner's episodes
        self.games = reports_games(envs)
        # A supervised worker's heartbeat (harness.roles.supervisor): [when it last stepped (0: not
        # stepping), frames stepped since its supervisor last took a batch]
        self.heartbeat: np.ndarray | None = None
        self.seed = seed  # the first reset's; a resumed run's collector reseeds past it
        # with memory: each env's recurrent state before its next step
        self.state: torch.Tensor | None = None
        self.reset(seed)

    def reset(self, seed: int) -> None:
        """Start fresh episodes in every env (a resumed run reseeds here), from a zero state."""
        obs, _ = self.envs.reset(seed=seed)
        self.obs_array, self.obs = obs, to_tensor(obs)
        if INITIAL_STATE in self.batch:
            self.state = torch.zeros_like(self.batch[INITIAL_STATE])
        self.episode_return = np.zeros(self.num_envs)
        self.episode_length = np.zeros(self.num_envs, dtype=np.int64)

    @torch.no_grad()
    def collect(self, header: Header, refresh: Callable[[], Header] | None = None) -> TensorDict:
        """One batch acted with ``header``'s weights, or, with ``refresh``
        (async mode), with whatever newest weights it returns before each step.

        The step loop only acts, steps and keeps references to what each step
        returned (env steps of a few microseconds make any more per step
        show: CartPole); the batch is written, and episode statistics
        counted, once per batch, with whole-array operations."""
        steps: list[tuple] = []
        versions: list[int] = []
        final: list[tuple[int, dict]] = []  # (step, info) where an episode ended
        act, state = self.policy.actor(), self.state
        if state is not None:
            self.batch[INITIAL_STATE].copy_(state)
        started, beat = time.perf_counter(), self.heartbeat
        for t in range(self.steps):
            if beat is not None:
                beat[0] = time.monotonic()
                beat[1] += self.num_envs
            if refresh is not None:
                header = refresh()
            if state is None:
                out = act(self.obs, header.values)
            else:  # the state after this step, zeroed where it ended an episode
                out = act(self.obs, header.values, state=state)
            env_action = out["action"].numpy()
            if self.clip is not None:
                # store the sample, step the env with a legal action
                env_action = np.clip(env_action, *self.clip)
            obs, reward, terminated, truncated, info = self.envs.step(env_action)
            if state is not None:  # the state after this step, zeroed where it ended an episode
                state, ended = out[STATE], terminated | truncated
                if ended.any():  # in place, through numpy: a third of restarted()'s product's time
                    state.numpy()[ended] = 0.0
            steps.append((self.obs_array, out, obs, reward, terminated, truncated))
            versions.append(header.version)
            if "final_obs" in info:
                final.append((t, info))
            self.obs_array, self.obs = obs, to_tensor(obs)
        self.state = state
        self._write(steps, versions, final)
        self.stats["collect_s"].fill_(time.perf_counter() - started)
        if beat is not None:
            beat[0] = (
                # not stepping: what follows (evaluation, handing the batch over) is not watched
                0.0
            )
        return self.batch

    def _write(
        self, steps: list[tuple], versions: list[int], final: list[tuple[int, dict]]
    ) -> None:
        """Fill the batch from one batch's steps, and count its episodes."""
        f, a, stats = self.fields, self.arrays, self.stats
        before, outs, after, rewards, terminated, truncated = zip(*steps)
        np.stack(before, out=a["obs"])
        for key in self.policy_fields:
            torch.stack([out[key] for out in outs], out=f[key])
        rewards64 = np.stack(rewards)  # as the env returned them: episode returns add these up
        a["reward"][:] = rewards64
        np.stack(terminated, out=a["terminated"])
        np.stack(truncated, out=a["truncated"])
        a["policy_version"][:] = np.asarray(versions)[:, None]
        torch.logical_or(f["terminated"], f["truncated"], out=f["done"])
        restarted = np.zeros(a["done"].shape, dtype=bool)
        if "next_obs" in a:
            np.stack(after, out=a["next_obs"])
        for t, info in final:  # same-step autoreset: obs is already the next episode's
            ended = np.flatnonzero(info["_final_obs"])
            if "next_obs" in a:
                for i in ended:
                    a["next_obs"][t, i] = info["final_obs"][i]
            flag = info["final_info"].get("env_restarted")
            if flag is not None:  # broken episodes: not counted as finished ones
                restarted[t] = flag & info["final_info"].get("_env_restarted", flag)
        for value in stats.values():
            value.zero_()
        self.ended_returns.clear()
        stats["env_restarts"].add_(int(restarted.sum()))
        if self.games:
            self._count_games(final)
        else:
            self._count_episodes(rewards64, a["done"] | restarted, restarted)
        self.batch["next_obs"].copy_(self.obs)

    def _count_games(self, final: list[tuple[int, dict]]) -> None:
        """Games that ended in this batch, as the envs report them
        (:class:`harness.collect.pixels.GameStats`): their raw returns and lengths, where the
        learner's episodes end at lost lives and see clipped rewards."""
        for t, info in final:
            ended = info["final_info"]
            for i in np.flatnonzero(ended.get("_game_return", ())):
                self.stats["episodes"].add_(1)
                self.stats["return_sum"].add_(float(ended["game_return"][i]))
                self.ended_returns.append((t * self.num_envs + i, float(ended["game_return"][i])))
                self.stats["length_sum"].add_(float(ended["game_length"][i]))

    def _count_episodes(self, rewards: np.ndarray, ends: np.ndarray, restarted: np.ndarray) -> None:
        """Episodes that ended in this batch (``ends [T, N]``, but for
        ``restarted`` ones): their number, returns and lengths. Each return is
        summed step by step from the previous batch's carry, and the totals
        step by step, in the order an accumulator updated at every step
        would add them: the same bits."""
        # step -> (env, return, length) of the episodes it ended
        ended: dict[int, list[tuple[int, float, int]]] = {}
        for i in range(self.num_envs):
            start, carry, length = 0, self.episode_return[i], int(self.episode_length[i])
            for t in np.flatnonzero(ends[:, i]).tolist():
                total = np.cumsum(np.concatenate(([carry], rewards[start : t + 1, i])))[-1]
                if not restarted[t, i]:
                    ended.setdefault(t, []).append((i, total, length + t + 1 - start))
                start, carry, length = t + 1, 0.0, 0
            self.episode_return[i] = np.cumsum(np.concatenate(([carry], rewards[start:, i])))[-1]
            self.episode_length[i] = length + len(rewards) - start
        for t in sorted(ended):
            episodes = sorted(ended[t])  # in env order, as a mask over the envs selects them
            self.stats["episodes"].add_(len(episodes))
            self.stats["return_sum"].add_(float(np.array([r for _, r, _ in episodes]).sum()))
            self.ended_returns.extend((t * self.num_envs + i, float(r)) for i, r, _ in episodes)
            self.stats["length_sum"].add_(
                float(np.array([n for _, _, n in episodes], dtype=np.int64).sum())
            )
