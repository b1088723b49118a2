"""The speed of recurrent PPO (``algo.memory``; issue 50's speed targets), one thread.

    python benchmarks/recurrent.py [--repeats 30] [--quick] [--json PATH]

Everything runs on ``experiment=ppo_popgym`` as composed from ``conf/`` (POPGym's Stateless
CartPole, Easy; an MLP encoder of 64, a GRU of 128; 16 envs x 64 steps a collector's batch; 4
epochs of 4 minibatches), with only ``algo.memory`` overridden.

Collector: a real collector as a collector rank builds it (``make_collector``: the preset's envs,
through ``make_vec_env``, and policy, with untrained weights), 4 batches' ``collect`` a sample (4 x
1,024 frames: acting, stepping the envs, writing the packed batch, counting episodes), with
``algo.memory=gru``, ``lstm`` and ``none`` (the feed-forward policy, the reference), frames per
second; the ratio is each round's recurrent / feed-forward frames per second (target: at least
0.8). Context only (2026-12-07): the same ratio against the feed-forward policy acted as one
function of tensors (``FeedForwardAsOneFunction``), as the recurrent policy now acts.

Update: ``algo.update`` on a round as the preset's trainer gets it, two collectors' batches (32
envs x 64 steps, collected above by the same kind of collector, two batches of one collector
standing in for two): one forward without gradients over the whole round for GAE's values
(``replay``), then 4 epochs x 4 minibatches of 8 whole env sequences, each the encoder, the
recurrence over 64 steps from the recorded state (zeroed after episode ends; the GRU: one stepped
TorchScript pass over every env with its own backward, ``harness/algos/gru_loop.py``; the LSTM:
oneDNN's fused calls over the sequences' pieces between ends, one per group of similar lengths),
both heads (one layer), the PPO loss, backward, gradient clipping and an Adam step. The floor: a
plain ``torch.nn.GRU`` (or ``nn.LSTM``) of the same sizes (input: the
encoder's 64 features, hidden: ``algo.memory_size``), forward and backward over one minibatch's
sequences (64 steps x 8 envs, gradients to the input as to the encoder's, from a zero state, no
resets), as many times as the update takes minibatch steps (16): only the recurrence, none of the
rest. The ratio is each round's update / floor (target: at most 1.3). On a CPU, torch's ``nn.LSTM``
runs forward and backward as oneDNN's fused RNN (``mkldnn_rnn_layer``), a true floor; ``nn.GRU``
has no fused CPU path for training (it steps the cell and back-propagates through every step's
operations) and takes about three times ``nn.LSTM``'s time though it multiplies less: the GRU's
ratio is against a weaker floor, which the harness's own GRU pass (the same maths, its weight
gradients in one matrix product) runs faster than (a ratio under 1 is possible). ``replay
share``: the part of the update in the forward for GAE. For context, ``algo.memory=none``'s update
on a round of the feed-forward collector's frames.

The recurrence alone (added 2026-12-07, beside the update's ratio, which is unchanged and is the
one the target is judged on): the harness's own sequence pass, ``RecurrentActorCritic.recurrence``
(the function ``unroll`` calls between the encoder and the heads), forward and backward over the
minibatches one untimed update stepped on (their recorded start states and episode ends: the same
sequences and pieces), on inputs of the floor's shape, against the same floor in the same rounds.

Each round times every case once, in turn (the order reversed every other round, so that a shared
machine's load falls on all alike), after one untimed warm-up round; Python's garbage collector
runs, untimed, before each timed call. Medians. The targets are judged on the wall clock, as
before; beside each ratio, the same ratio of this thread's CPU time (``time.thread_time``: the
envs, the policy and the update all run on it), which a machine shared with more runnable jobs
than cores sways less (added 2026-12-07, when the load average stood at 10-14 on 2 cores).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch
from hydra import compose, initialize_config_dir
from tensordict import TensorDict
from torch import nn
from torch.nn import functional as F

from harness.algos.base import Policy
from harness.algos.memory import RecurrentActorCritic, pieces, time_major
from harness.algos.ppo import PPO
from harness.algos.ppo_policy import PPOPolicy
from harness.collect.rollout import RolloutCollector
from harness.config import Config, load, register_configs
from harness.core.specs import EnvSpec
from harness.roles.collector import make_collector
from harness.sync import Header

ROOT = Path(__file__).resolve().parents[1]
MEMORIES = ("none", "gru", "lstm")  # none: the feed-forward reference
ONE_FUNCTION = "none, one function"  # context: FeedForwardAsOneFunction's collector
COLLECTORS = 2  # ppo_popgym's layout: 1 trainer, 2 collectors (a trainer's round is both batches)
BATCHES = 4  # a collector's sample: one batch (~60 ms here) is short enough for load to sway it
COLLECTOR_TARGET, UPDATE_TARGET = 0.8, 1.3  # issue 50


def preset(memory: str) -> Config:
    """``experiment=ppo_popgym algo.memory=<memory>``, as ``harness train`` would load it."""
    register_configs()
    with initialize_config_dir(version_base=None, config_dir=str(ROOT / "conf")):
        return load(compose("config", overrides=["experiment=ppo_popgym", f"algo.memory={memory}"]))


def rounds(
    fns: dict[str, Callable[[], object]], repeats: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds of each of ``fns`` in each of ``repeats`` rounds (after a warm-up round), every
    round running each once, in turn, the order reversed every other round: wall-clock seconds,
    and this thread's CPU seconds (on a shared, oversubscribed machine the wall clock also counts
    the time other jobs held the core; everything here runs on this one thread)."""
    wall: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(repeats + 1):
        order = list(fns) if round_ % 2 else list(reversed(fns))
        for name in order:
            gc.collect()
            start, start_cpu = time.perf_counter(), time.thread_time()
            fns[name]()
            seconds, cpu_seconds = time.perf_counter() - start, time.thread_time() - start_cpu
            if round_:
                wall[name].append(seconds)
                cpu[name].append(cpu_seconds)
    return wall, cpu


def collector_rows(
    collectors: dict[str, RolloutCollector], repeats: int
) -> tuple[list[dict[str, Any]], int]:
    """Frames per second of each collector's ``collect``, and recurrent / feed-forward."""
    frames = BATCHES * collectors["none"].steps * collectors["none"].num_envs

    def collect(collector: RolloutCollector) -> Callable[[], object]:
        return lambda: [collector.collect(Header(0)) for _ in range(BATCHES)]

    samples, cpu = rounds({m: collect(c) for m, c in collectors.items()}, repeats)

    def vs(reference: str, memory: str, times: dict[str, list[float]]) -> float:  # fps ratio
        return statistics.median(ref / own for own, ref in zip(times[memory], times[reference]))

    rows = []
    for memory, seconds in samples.items():
        row: dict[str, Any] = {
            "case": f"collector/{memory}",
            "frames_per_s": frames / statistics.median(seconds),
        }
        if memory in ("gru", "lstm"):
            row["vs_none"], row["vs_none_cpu"] = (
                vs("none", memory, samples),
                vs("none", memory, cpu),
            )
            row["target_met"] = row["vs_none"] >= COLLECTOR_TARGET
            row["vs_none_one_function"] = vs(ONE_FUNCTION, memory, samples)
            row["vs_none_one_function_cpu"] = vs(ONE_FUNCTION, memory, cpu)
        rows.append(row)
    return rows, frames


class FeedForwardAsOneFunction(Policy):
    """The feed-forward policy's sampled step as one function of tensors, the way
    ``harness/algos/memory_act.py`` acts for a recurrent one (no module calls, no ``Categorical``;
    the same operations, the same bits): for context only, what the recurrent collectors would be
    compared with were the feed-forward policy acted that way too. Not what the harness runs."""

    def __init__(self, policy: PPOPolicy):
        super().__init__()
        self.policy = policy
        first, _, last = policy.net  # the preset's hidden_sizes [64]: Linear, Tanh, Linear
        self.layers = (cast(nn.Linear, first), cast(nn.Linear, last))

    def forward(
        self, obs: torch.Tensor, values: Mapping[str, float] = {}, deterministic: bool = False
    ) -> TensorDict:
        first, last = self.layers
        x = torch.tanh(F.linear(obs.flatten(1), first.weight, first.bias))
        logits = F.linear(x, last.weight, last.bias).float()
        logits = logits - logits.logsumexp(-1, keepdim=True)
        action = torch.multinomial(torch.softmax(logits, -1), 1, True)
        logprob = logits.gather(-1, action).squeeze(-1)
        outs = {"action": action.squeeze(1), "logprob": logprob}
        return TensorDict(outs, batch_size=obs.shape[:1])


class Floor:
    """``passes`` forward and backward passes of a plain ``nn.GRU`` / ``nn.LSTM`` over ``steps`` x
    ``envs`` sequences of ``features``: the recurrence alone, as torch's own RNN modules run it."""

    def __init__(self, kind: str, features: int, size: int, steps: int, envs: int, passes: int):
        self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(features, size)
        self.x = torch.randn(steps, envs, features, requires_grad=True)  # the encoder's output
        self.passes = passes

    def __call__(self) -> None:
        for _ in range(self.passes):
            self.rnn.zero_grad(set_to_none=True)
            self.x.grad = None
            out, _ = self.rnn(self.x)
            out.sum().backward()


class Recurrence:
    """The harness's own recurrence, forward and backward, over the minibatches one update of
    ``algo`` stepped on: :meth:`RecurrentActorCritic.recurrence` (the function ``unroll`` calls
    between the encoder and the heads) from each minibatch's recorded start states, restarted after
    its episode ends, on inputs of the floor's shape (the encoder's features, random, gradients to
    them as to the encoder's). The same weights, sequences and pieces as the update; none of the
    rest (encoder, heads, loss, Adam). ``pieces``: a minibatch's pieces, on average."""

    def __init__(self, algo: PPO, batches: list[TensorDict], features: int):
        core = algo.policy.memory
        assert isinstance(core, RecurrentActorCritic)
        self.core: RecurrentActorCritic = core
        recorded: list[tuple[torch.Tensor, torch.Tensor]] = []
        step = algo.minibatch_step

        def noted(mb: TensorDict) -> dict[str, torch.Tensor]:
            frames, state = time_major(mb)
            recorded.append((state.clone(), frames["done"].clone()))
            return step(mb)

        algo.minibatch_step = noted  # type: ignore[method-assign]  # for one update, untimed
        algo.update(batches, 0)
        del algo.minibatch_step  # the class's again
        self.minibatches = [
            (state, done, torch.randn(*done.shape, features, requires_grad=True))
            for state, done in recorded
        ]
        self.pieces = statistics.mean(len(pieces(done)[2]) for _, done, _ in self.minibatches)

    def __call__(self) -> None:
        for state, done, x in self.minibatches:
            self.core.zero_grad(set_to_none=True)
            x.grad = None
            self.core.recurrence(x, state, done).sum().backward()


def minibatches(envs: int, cfg: Config) -> tuple[int, int]:
    """The env sequences of a minibatch and the minibatch steps of an update, as ``PPO.epochs``
    splits a round of ``envs`` sequences."""
    per_minibatch = max(envs // cfg.algo.num_minibatches, 1)
    return per_minibatch, cfg.algo.update_epochs * len(range(0, envs, per_minibatch))


def round_of(collector: RolloutCollector) -> list[TensorDict]:
    """A trainer's round of ``COLLECTORS`` batches (copies: the collector reuses its batch)."""
    return [collector.collect(Header(0)).clone() for _ in range(COLLECTORS)]


def timed_replay(algo: PPO, spent: list[float]) -> None:
    """Notes in ``spent`` the seconds each of ``algo``'s updates spends in ``replay``."""
    replay = algo.replay

    def timed(
        obs: torch.Tensor, rollout: TensorDict, state: torch.Tensor, next_obs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        start = time.perf_counter()
        out = replay(obs, rollout, state, next_obs)
        spent.append(time.perf_counter() - start)
        return out

    algo.replay = timed  # type: ignore[method-assign]  # this instance's, which PPO.targets calls


def update_rows(
    configs: dict[str, Config],
    collectors: dict[str, RolloutCollector],
    specs: dict[str, EnvSpec],
    repeats: int,
) -> list[dict[str, Any]]:
    """Each kind's update on a round of its collector's frames against its floor; and the
    feed-forward update's time, for context."""
    fns: dict[str, Callable[[], object]] = {}
    replays: dict[str, list[float]] = {}
    shape: dict[str, int] = {}
    pieces_of: dict[str, float] = {}
    for memory, cfg in configs.items():
        batches = round_of(collectors[memory])
        algo = PPO(cfg.algo, specs[memory], cfg.collector.total_frames)
        fns[f"update/{memory}"] = partial(algo.update, batches, 0)
        if memory == "none":
            continue
        replays[memory] = []
        timed_replay(algo, replays[memory])
        steps, envs = batches[0]["rollout"].shape[0], COLLECTORS * batches[0]["rollout"].shape[1]
        per_minibatch, passes = minibatches(envs, cfg)
        assert algo.policy.memory is not None
        features = algo.policy.memory.cell.input_size
        fns[f"floor/{memory}"] = Floor(
            memory, features, cfg.algo.memory_size, steps, per_minibatch, passes
        )
        fns[f"recurrence/{memory}"] = recurrence = Recurrence(algo, batches, features)
        pieces_of[memory] = recurrence.pieces
        shape = {"steps": steps, "envs": envs, "minibatch_envs": per_minibatch, "passes": passes}
        shape["features"] = features
    samples, cpu = rounds(fns, repeats)
    rows: list[dict[str, Any]] = []
    for memory in configs:
        update = samples[f"update/{memory}"]
        row: dict[str, Any] = {"case": f"update/{memory}", "ms": 1e3 * statistics.median(update)}
        if memory != "none":
            floor = samples[f"floor/{memory}"]
            ratios = [u / f for u, f in zip(update, floor)]
            cpu_ratios = zip(cpu[f"update/{memory}"], cpu[f"floor/{memory}"])
            in_replay = replays[memory][-len(update) :]  # the timed rounds' (warm-up's first)
            row |= {
                "floor_ms": 1e3 * statistics.median(floor),
                "vs_floor": statistics.median(ratios),
                "vs_floor_cpu": statistics.median(u / f for u, f in cpu_ratios),
                "replay_share": statistics.median(r / u for r, u in zip(in_replay, update)),
                **shape,
            }
            row["target_met"] = row["vs_floor"] <= UPDATE_TARGET
            row |= recurrence_ratios(samples, cpu, memory) | {"pieces": pieces_of[memory]}
        rows.append(row)
    return rows


def recurrence_ratios(
    samples: dict[str, list[float]], cpu: dict[str, list[float]], memory: str
) -> dict[str, Any]:
    """The recurrence alone against the floor, per round: wall clock and thread CPU time."""
    own, floor = samples[f"recurrence/{memory}"], samples[f"floor/{memory}"]
    own_cpu, floor_cpu = cpu[f"recurrence/{memory}"], cpu[f"floor/{memory}"]
    ratio = statistics.median(r / f for r, f in zip(own, floor))
    return {
        "recurrence_ms": 1e3 * statistics.median(own),
        "recurrence_vs_floor": ratio,
        "recurrence_vs_floor_cpu": statistics.median(r / f for r, f in zip(own_cpu, floor_cpu)),
        "recurrence_target_met": ratio <= UPDATE_TARGET,
    }


def report(collector: list[dict[str, Any]], frames: int, update: list[dict[str, Any]]) -> None:
    met = {True: "met", False: "missed"}
    print(f"collector, {frames:,} frames a sample: frames/s (recurrent / feed-forward per round)")
    for row in collector:
        line = f"  memory={row['case'].split('/')[1]:<5} {row['frames_per_s']:9,.0f} frames/s"
        if "vs_none" in row:
            target = f"target >= {COLLECTOR_TARGET}x: {met[row['target_met']]}"
            line += f"   {row['vs_none']:.2f}x none ({target}; CPU time {row['vs_none_cpu']:.2f}x)"
            line += (
                f"   context: {row['vs_none_one_function']:.2f}x none acted as one function "
                f"(CPU time {row['vs_none_one_function_cpu']:.2f}x)"
            )
        elif row["case"].endswith(ONE_FUNCTION):
            line += "   (context: the feed-forward policy acted as one function, not the harness's)"
        print(line)
    shape = next(row for row in update if "passes" in row)
    print(
        f"update, a round of {shape['envs']} envs x {shape['steps']} steps, {shape['passes']} "
        f"minibatch steps of {shape['minibatch_envs']} env sequences; floor: plain nn.GRU/nn.LSTM "
        f"forward+backward over {shape['steps']} x {shape['minibatch_envs']} x "
        f"{shape['features']} features, {shape['passes']} times"
    )
    for row in update:
        line = f"  memory={row['case'].split('/')[1]:<5} update {row['ms']:7.1f} ms"
        if "vs_floor" in row:
            target = f"target <= {UPDATE_TARGET}x: {met[row['target_met']]}"
            line += (
                f"   floor {row['floor_ms']:6.1f} ms   {row['vs_floor']:.2f}x floor ({target}; CPU "
                f"time {row['vs_floor_cpu']:.2f}x)"
                f"   replay share {row['replay_share']:.0%}"
            )
        else:
            line += "   (feed-forward, for context)"
        print(line)
    print(
        "the recurrence alone (the update's own sequence pass over its minibatches, restarts and "
        "recorded start states; no encoder, heads, loss or Adam) against the same floor:"
    )
    for row in update:
        if "recurrence_ms" in row:
            target = f"target <= {UPDATE_TARGET}x: {met[row['recurrence_target_met']]}"
            print(
                f"  memory={row['case'].split('/')[1]:<5} recurrence {row['recurrence_ms']:7.1f} ms"
                f"   {row['recurrence_vs_floor']:.2f}x floor ({target}; CPU time "
                f"{row['recurrence_vs_floor_cpu']:.2f}x)   {row['pieces']:.1f} pieces a minibatch"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=30, help="timed rounds (after a warm-up)")
    parser.add_argument("--quick", action="store_true", help="3 rounds: a check that it runs")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    if repeats < 1:
        parser.error(f"--repeats {repeats}: at least 1")
    torch.set_num_threads(1)
    configs = {memory: preset(memory) for memory in MEMORIES}
    built = {memory: make_collector(cfg, rank=1) for memory, cfg in configs.items()}
    collectors = {memory: b[0] for memory, b in built.items()}
    specs = {memory: b[3] for memory, b in built.items()}
    one_function = make_collector(configs["none"], rank=1)[0]
    one_function.policy = FeedForwardAsOneFunction(cast(PPOPolicy, one_function.policy))
    collector, frames = collector_rows({**collectors, ONE_FUNCTION: one_function}, repeats)
    update = update_rows(configs, collectors, specs, repeats)
    load = os.getloadavg()[0]  # a shared machine: say how busy it was
    print(f"ppo_popgym, 1 thread, medians of {repeats} interleaved rounds, load {load:.1f}")
    report(collector, frames, update)
    if args.json:
        Path(args.json).write_text(json.dumps(collector + update, indent=1))


if __name__ == "__main__":
    main()
