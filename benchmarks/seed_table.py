"""TorchRL's benchmark table run on the harness, and side by side on TorchRL itself.

    python benchmarks/seed_table.py [--peer /tmp/peer-venv/bin/python] [--json PATH]
        [--repeats 40] [--only gae sac ...]

The cases are TorchRL 0.14.1's (``benchmarks/test_objectives_benchmarks.py``,
``benchmarks/test_replaybuffer_benchmark.py``) at their shapes: GAE (``test_gae_speed``: 1 and 32
sequences of 512; ``test_values``: 300 of 500), each loss's forward and forward+backward (DQN, SAC,
TD3, CQL, PPO, IQL: 8 observation dims, 4 action dims, batch 128, PPO and IQL 128 x 10), and the
replay buffer's uniform sample, populate and extend+sample cases; V-trace at GAE's shapes besides.
benchmarks/seed_harness.py runs them on the harness's own code (and says how its losses are
timed); with ``--peer PYTHON``, benchmarks/seed_torchrl.py runs them on TorchRL, in PYTHON, a
scratch environment outside the repository::

    python3 -m venv /tmp/peer-venv && /tmp/peer-venv/bin/pip install torch==2.13.0 torchrl==0.14.1

as a subprocess of this script (``--side torchrl``, the only mode that imports torchrl). Both
sides run one thread, eager. Each round times every case once on each side in turn (which side
goes first alternates by round), so that a shared machine's load falls on both alike; a sample is
as many calls as take about 10 ms, with untimed set-up before each call where TorchRL's test has
one (``loss.zero_grad`` before forward+backward). The table: medians over rounds in ms per call,
the ratio TorchRL time / harness time (above 1: the harness is faster; the median and quartiles
of each round's ratio, its two samples taken back to back), and each side's
multiply-adds per call (matrix products and convolutions, backward's too, counted as they run),
with a note where the two sides' work differs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

Call = Callable[[], object]
Case = tuple[Call, Call | None]  # the timed call, and what runs untimed before each call
SAMPLE_S = 0.01  # a sample's length: enough calls that the clock's resolution does not matter
aten = torch.ops.aten


class MultiplyAdds(TorchDispatchMode):
    """Counts the multiply-adds of every matrix product (batched ones per matrix) and convolution
    that runs while it is active, backward's too."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        op = func.overloadpacket
        if op is aten.convolution:  # per output element, in-channels (per group) x kernel
            self.count += out.numel() * args[1][0].numel()
        elif op in (aten.mm, aten.bmm, aten.addmm, aten.baddbmm):
            a, b = args[:2] if op in (aten.mm, aten.bmm) else args[1:3]
            self.count += (
                (a.shape[0] if a.dim() == 3 else 1) * a.shape[-2] * a.shape[-1] * b.shape[-1]
            )
        return out


def seconds_per_call(fn: Call, setup: Call | None, calls: int) -> float:
    total = 0.0
    for _ in range(calls):
        if setup is not None:
            setup()
        start = time.perf_counter()
        fn()
        total += time.perf_counter() - start
    return total / calls


class Side:
    """One side's cases, warmed up, each with its multiply-adds per call and the calls a sample
    takes (``info``); ``time`` takes one sample."""

    def __init__(self, cases: dict[str, Case]):
        self.cases, self.info = cases, {}
        for name, (fn, setup) in cases.items():
            seconds_per_call(fn, setup, 2)  # first calls allocate, lazy storages initialise
            one = statistics.median(seconds_per_call(fn, setup, 1) for _ in range(3))
            if setup is not None:
                setup()
            with MultiplyAdds() as counted:
                fn()
            self.info[name] = {"macs": counted.count, "calls": max(1, round(SAMPLE_S / one))}

    def time(self, name: str) -> float:
        fn, setup = self.cases[name]
        return seconds_per_call(fn, setup, self.info[name]["calls"])


class Peer:
    """TorchRL's side, in another Python (``--side torchrl``), answering one line per request."""

    def __init__(self, python: str, only: list[str]):
        self.process = subprocess.Popen(
            [python, os.path.abspath(__file__), "--side", "torchrl", "--only", *only],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "RL_WARNINGS": "False"},
        )
        hello = self.ask(None)
        self.info, self.versions = hello["cases"], hello["versions"]

    def ask(self, request: dict | None) -> dict:
        assert self.process.stdin is not None and self.process.stdout is not None
        if request is not None:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the TorchRL side exited with status {self.process.wait()}")
        return json.loads(line)

    def time(self, name: str) -> float:
        return self.ask({"time": name})["s"]

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


def chosen(cases: dict[str, Case], only: list[str]) -> dict[str, Case]:
    """The cases whose name contains one of ``only`` (all without)."""
    return {k: v for k, v in cases.items() if not only or any(word in k for word in only)}


def serve(only: list[str]) -> None:
    """TorchRL's side: its cases' ``info``, then one sample per request line, until stdin ends."""
    # Replies on a copy of stdout; whatever else is printed (Python or C) goes to stderr.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torchrl
    from seed_torchrl import torchrl_cases  # benchmarks/; imports torchrl

    # TorchRL logs each lazy storage's first write at INFO, inside the timed call
    logging.getLogger("torchrl").setLevel(logging.WARNING)

    def reply(message: dict) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    side = Side(chosen(torchrl_cases(), only))
    reply(
        {
            "cases": side.info,
            "versions": {
                "torch": torch.__version__,
                "torchrl": torchrl.__version__,
                "torchrl_side_threads": torch.get_num_threads(),
            },
        }
    )
    for line in sys.stdin:
        reply({"s": side.time(json.loads(line)["time"])})


def measure(args: argparse.Namespace) -> dict:
    """Every case's samples, both sides interleaved; the rows and what they ran on."""
    from seed_harness import harness_cases, note_for  # benchmarks/

    harness = Side(chosen(harness_cases(), args.only))
    peer = Peer(args.peer, args.only) if args.peer else None
    sides: dict[str, Side | Peer] = {"harness": harness, **({"torchrl": peer} if peer else {})}
    names = [*harness.info, *(n for n in (peer.info if peer else {}) if n not in harness.info)]
    samples: dict[str, dict[str, list[float]]] = {
        name: {side: [] for side in sides} for name in names
    }
    for round_ in range(args.repeats):
        order = list(sides.items())[:: -1 if round_ % 2 else 1]
        for name in names:
            for label, side in order:
                if name in side.info:
                    samples[name][label].append(side.time(name))
        print(f"round {round_ + 1} of {args.repeats}", file=sys.stderr, flush=True)
    if peer is not None:
        peer.close()
    rows = []
    for name in names:
        row: dict[str, Any] = {"case": name}
        for label, side in sides.items():
            if samples[name][label]:
                row[f"{label}_ms"] = 1000 * statistics.median(samples[name][label])
                row[f"{label}_macs"] = side.info[name]["macs"]
                row[f"{label}_samples_ms"] = [1000 * s for s in samples[name][label]]
        if "harness_ms" in row and "torchrl_ms" in row:
            # each round's two samples, taken back to back, saw the same load: their ratio is
            # steadier than the ratio of the medians on a machine whose load drifts
            ratios = [t / h for t, h in zip(samples[name]["torchrl"], samples[name]["harness"])]
            row["ratio"] = statistics.median(ratios)
            quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
            row["ratio_quartiles"] = [quartiles[0], quartiles[2]]
        rows.append({**row, "note": note_for(name)})
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "versions": {"torch": torch.__version__, **(peer.versions if peer else {})},
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--peer", help="a Python with torchrl installed: time TorchRL's side there")
    parser.add_argument("--json", help="write the rows and the versions here")
    parser.add_argument("--repeats", type=int, default=40, help="rounds (samples per case)")
    parser.add_argument(
        "--only", nargs="*", default=[], help="only cases whose name contains one of these"
    )
    parser.add_argument("--side", choices=["torchrl"], help=argparse.SUPPRESS)  # the peer's mode
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.side == "torchrl":
        serve(args.only)
        return
    from seed_harness import table  # benchmarks/

    result = measure(args)
    print(table(result["rows"], bool(args.peer)))
    slower = [r["case"] for r in result["rows"] if r.get("ratio", 1.0) < 1.0]
    if args.peer:
        print(f"\nbelow 1.0x TorchRL's speed: {', '.join(slower) or 'none'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
