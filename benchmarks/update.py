"""Time per gradient update of each algorithm against two yardsticks, and replay throughput.

    python benchmarks/update.py --json bench-update.json \\
        [--device cuda] [--compile] [--amp] [--only sac td3]

Measured in the same run, in interleaved rounds (a shared machine's load falls
on all alike), medians: ``update/<algo>``, the harness's step (``algo.learn``
on a fixed batch); ``reference/<algo>``, the same step as a single-file
implementation (CleanRL's, offline CORL's) writes it, in reference_steps.py:
separate critic modules, ``.item()`` after each step, default Adam, a
Python-loop Polyak update;
``limit/<algo>``, the harness step's matrix multiplications alone (backward's
too) as raw ``torch.mm`` calls of the same shapes, the floor this machine
allows. SAC and TD3 time pairs of steps (their actor updates every second one),
reported per step. ``--compile`` adds ``update/<algo>/compiled`` (``compile_s``:
the first call); ``--amp`` adds ``update/<algo>/amp``, the eager step with
``algo.amp=bf16`` (with ``--compile`` as well: ``update/<algo>/compiled_amp``, both).
``--device cuda`` times on the GPU (each timing ends with a synchronisation).
CleanRL's (CORL's) sizes, batch 256 (PPO: one minibatch step),
Pendulum-v1 (SAC, TD3, IQL, CQL with 10 and 4 sampled actions) and CartPole-v1
(DQN, PPO, discrete CQL) shapes; ``ppo_atari``: PPO's Nature CNN on 256 Atari frames
(``[4, 84, 84]`` uint8). Replay: ``extend`` of 1,000 and ``sample`` of
256 HalfCheetah-sized transitions at 100k and 1M capacity (reference: a plain
index of one field); offline: 256 from a memory-mapped 1M dataset (reference: from RAM).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from reference_steps import (  # benchmarks/
    reference_cql,
    reference_dqn,
    reference_iql,
    reference_sac,
    reference_td3,
)
from tensordict import TensorDict
from torch.utils._python_dispatch import TorchDispatchMode

from harness.algos import Algorithm, algorithm_for
from harness.algos.devices import check_devices
from harness.algos.optim import step
from harness.algos.replay import ReplayBuffer
from harness.collect.envs import env_spec
from harness.core.specs import EnvSpec
from harness.data import dataset

Step = Callable[[], object]
aten = torch.ops.aten


def timed(fns: dict[str, Step], repeats: int, sync: Callable[[], None]) -> dict[str, float]:
    """Median seconds of each of ``fns``, run in turn in every round (after one warm-up round)."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(repeats + 1):
        for name, fn in fns.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            if round_:
                samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in samples.items()}


class MatmulShapes(TorchDispatchMode):
    """Records ``(m, k, n)`` of every matrix multiplication that runs (backward's too); a batched
    one counts per matrix."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        op = func.overloadpacket
        if op in (aten.mm, aten.addmm, aten.bmm, aten.baddbmm):
            a, b = args[-2:] if op in (aten.mm, aten.bmm) else args[1:3]
            self.shapes += [(a.shape[-2], a.shape[-1], b.shape[-1])] * (
                a.shape[0] if a.dim() == 3 else 1
            )
        return func(*args, **(kwargs or {}))


def limit_of(step: Step, device: str) -> Step:
    """The matrix multiplications ``step`` runs, as raw ``torch.mm`` calls on operands made
    beforehand."""
    with MatmulShapes() as seen:
        step()
    operands = [
        (torch.randn(m, k, device=device), torch.randn(k, n, device=device))
        for m, k, n in seen.shapes
    ]
    return lambda: [torch.mm(a, b) for a, b in operands]


def batch(obs_dim: int, action: torch.Tensor, device: str, n: int = 256) -> TensorDict:
    return TensorDict(
        obs=torch.randn(n, obs_dim),
        next_obs=torch.randn(n, obs_dim),
        reward=torch.randn(n),
        terminated=torch.zeros(n, dtype=torch.bool),
        action=action,
        batch_size=[n],
    ).to(device)


def learner(
    name: str,
    spec: EnvSpec,
    data: TensorDict,
    steps: int,
    device: str,
    compiled: bool,
    amp: bool = False,
    **fields,
) -> tuple[Step, Algorithm]:
    """``steps`` gradient steps of ``algo=name`` on ``data``, as ``update`` takes them (losses
    under ``algo.autocast()``); PPO: one minibatch step. And the algorithm, for the device check."""
    cls = algorithm_for(name, spec)
    # Any: PPO steps through losses(), the others through learn(), methods of the concrete classes
    algo: Any = cls(
        cls.Config(compile=compiled, amp="bf16" if amp else "off", **fields),
        spec,
        10**6,
        device=device,
    )
    if name == "ppo":

        def minibatch() -> None:
            with algo.autocast():
                loss = algo.losses(data)["loss"]
            step(algo.optimizer, loss)

        return minibatch, algo

    def learn() -> None:
        for _ in range(steps):
            algo.gradient_steps += 1
            with algo.autocast():
                algo.learn(data)

    return learn, algo


def cases(
    device: str,
) -> list[
    tuple[str, str, EnvSpec, TensorDict, int, dict, Callable[[TensorDict, str], Step] | None]
]:
    """(case, algo, env, batch, steps per timing, config fields, reference)."""
    pendulum, cartpole = env_spec("Pendulum-v1"), env_spec("CartPole-v1")
    box, choice = (lambda: torch.rand(256, 1) * 4 - 2), (lambda: torch.randint(0, 2, (256,)))
    ppo = (
        TensorDict(
            obs=torch.randn(256, 4),
            action=choice(),
            logprob=torch.full((256,), -0.69),
            advantage=torch.randn(256),
            value=torch.randn(256),
            batch_size=[256],
        )
        .set("return", torch.randn(256))
        .to(device)
    )
    # PPO's Nature CNN on Atari frames (ppo_atari's minibatch: 1,024 frames a round / 4), the
    # spec written out so that no Atari package is needed
    breakout = EnvSpec(
        (4, 84, 84), discrete=True, action_shape=(), num_actions=4, obs_dtype="uint8"
    )
    frames = ppo.to("cpu").clone()
    frames["obs"] = torch.randint(0, 256, (256, 4, 84, 84), dtype=torch.uint8)
    frames["action"] = torch.randint(0, 4, (256,))
    return [
        ("sac", "sac", pendulum, batch(3, box(), device), 2, {}, reference_sac),
        ("td3", "td3", pendulum, batch(3, box(), device), 2, {}, reference_td3),
        ("dqn", "dqn", cartpole, batch(4, choice(), device), 1, {}, reference_dqn),
        ("iql", "iql", pendulum, batch(3, box(), device), 1, {}, reference_iql),
        (
            "cql",
            "cql",
            pendulum,
            batch(3, box(), device),
            1,
            {},
            lambda d, dev: reference_cql(d, dev, 10),
        ),
        (
            "cql_4_actions",
            "cql",
            pendulum,
            batch(3, box(), device),
            1,
            {"n_actions": 4},
            lambda d, dev: reference_cql(d, dev, 4),
        ),
        ("cql_discrete", "cql", cartpole, batch(4, choice(), device), 1, {}, None),
        ("ppo", "ppo", cartpole, ppo, 1, {}, None),
        ("ppo_atari", "ppo", breakout, frames.to(device), 1, {}, None),
    ]


def update_rows(
    device: str,
    repeats: int,
    compiled: bool,
    only: list[str],
    amp: bool = False,
    written: Callable[[list[dict]], None] = lambda rows: None,
) -> list[dict]:
    """Every case's rows; ``written`` gets the rows so far after each case (a run cut short keeps
    them)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    rows: list[dict] = []
    chosen = [c for c in cases(device) if not only or c[0] in only]
    for case, name, spec, data, steps, fields, reference in sorted(
        chosen, key=lambda c: only.index(c[0]) if only else 0
    ):
        update, algo = learner(name, spec, data, steps, device, False, **fields)
        fns = {"update": update, "limit": limit_of(update, device)}
        if reference is not None:
            one = reference(data, device)
            fns["reference"] = lambda: [one() for _ in range(steps)]
        if amp:
            fns["amp"] = learner(name, spec, data, steps, device, False, amp=True, **fields)[0]
        if compiled:  # the first call compiles (a cold cache: see main)
            fns["compiled"], start = (
                learner(name, spec, data, steps, device, True, **fields)[0],
                time.perf_counter(),
            )
            fns["compiled"]()
            sync()
            compile_s = time.perf_counter() - start
        if compiled and amp:  # both, as a preset with compile and algo.amp=bf16 steps
            fns["compiled_amp"] = learner(name, spec, data, steps, device, True, True, **fields)[0]
            fns["compiled_amp"]()
        seconds = timed(fns, repeats, sync)
        # where the timed update's tensors are (it raises, naming any elsewhere)
        found = check_devices(algo)
        for kind in fns:
            row = {
                "case": f"update/{case}/{kind}"
                if kind in ("compiled", "amp", "compiled_amp")
                else f"{kind}/{case}",
                "ms": 1000 * seconds[kind] / steps,
                "device": device,
                **({"devices": found} if kind == "update" else {}),
            }
            rows.append({**row, "compile_s": compile_s} if kind == "compiled" else row)
            print(rows[-1], flush=True)
        written(rows)
    return rows


def storage_rows(repeats: int) -> list[dict]:
    def rate(n: int, fn: Step) -> float:
        return n / timed({"fn": fn}, repeats, lambda: None)["fn"]

    rows, transition = (
        [],
        TensorDict(
            obs=torch.zeros(17),
            next_obs=torch.zeros(17),
            action=torch.zeros(6),
            reward=torch.zeros(()),
            terminated=torch.zeros((), dtype=torch.bool),
        ),
    )
    for capacity in (100_000, 1_000_000):
        buffer, chunk = ReplayBuffer(capacity, transition), transition.expand(1000).clone()
        rows += [
            {
                "case": f"replay/extend/{capacity}",
                "transitions_per_s": rate(1000, lambda: buffer.extend(chunk)),
            },
            {
                "case": f"replay/sample/{capacity}",
                "transitions_per_s": rate(256, lambda: buffer.sample(256)),
            },
            {
                "case": f"reference/index_one_field/{capacity}",
                "transitions_per_s": rate(
                    256, lambda: buffer.storage["obs"][torch.randint(0, buffer.size, (256,))]
                ),
            },
        ]
    with tempfile.TemporaryDirectory() as tmp:
        n = 1_000_000
        data = TensorDict(
            obs=torch.randn(n, 11),
            next_obs=torch.randn(n, 11),
            action=torch.randn(n, 3),
            reward=torch.randn(n),
            terminated=torch.zeros(n, dtype=torch.bool),
            truncated=torch.zeros(n, dtype=torch.bool),
            batch_size=[n],
        )
        dataset.save(
            tmp,
            data,
            dataset.Meta(env="Hopper-v5", transitions=n, episodes=0, behaviour_return=0.0),
        )
        mapped, _ = dataset.load(tmp)
        rows += [
            {
                "case": "dataset/sample/memmap/1000000",
                "transitions_per_s": rate(256, lambda: mapped[torch.randint(0, n, (256,))]),
            },
            {
                "case": "reference/dataset/sample/ram/1000000",
                "transitions_per_s": rate(256, lambda: data[torch.randint(0, n, (256,))]),
            },
        ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--repeats", type=int, default=30, help="timed rounds per case")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--compile", action="store_true", help="also time each step with algo.compile=true"
    )
    parser.add_argument(
        "--amp", action="store_true", help="also time each step with algo.amp=bf16 (eager)"
    )
    parser.add_argument(
        "--only",
        nargs="*",
        default=[],
        help="only these update cases (sac, td3, ...), in this order; no replay rows",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    # compile from scratch, as a fresh machine would: no kernels cached by an earlier run
    if args.compile:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")

    def write(rows: list[dict]) -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)

    rows = update_rows(args.device, args.repeats, args.compile, args.only, args.amp, write)
    if not args.only:
        rows += storage_rows(args.repeats)
        print(*rows[-8:], sep="\n")
    write(rows)


if __name__ == "__main__":
    main()
