"""The job grown: start-up, weight sync and batch intake with 2 to 32 collectors.

    # every size and scheme (rows written after each case)
    python benchmarks/scale.py --json bench-scale.json
    # 2 collectors, the smoke run
    python benchmarks/scale.py --quick --json /tmp/scale.json

Each case is one real launch: ``torchrun`` with 1 trainer + N collectors on
one node, or (``nodes=2``, where network namespaces can be made: root and
iproute2) two torchruns in two namespaces joined by a veth pair, meeting at a
c10d rendezvous, half the collectors on each. The ranks are real harness
pieces: ``init_distributed``, the scheme's publisher and subscribers, the data
channel, ``RolloutCollector`` stepping CartPole-v1 (the default job's 4 envs
and 256 frames a batch) with a PPO policy. The published payload also carries
a ballast model of ``--params`` float32 parameters (100 tensors), so that
the weights have a size worth moving. Per case:

- ``startup_s``: from the launch to the trainer's first batch (all of it:
  processes, imports, process groups, handshakes, the first publish and
  batch); ``after_imports_s``: from the moment the last rank finished
  importing torch and the harness to that first batch: the harness's own part;
  ``imported_s``, ``config_s``, ``groups_s``: from the launch to the moment
  the last rank had imported, composed its config, made its process groups;
- ``intake_frames_per_s``: the trainer takes batches from whichever collector
  sends first and does nothing with them (a trivial update), as async mode's
  loop does; collectors poll for weights before every step, as they do there.
  The median of 1-second windows over ``--intake-s`` seconds;
- ``channel_frames_per_s`` (and ``channel_mb_per_s``): the same, but the
  collectors send the same batch again and again without stepping envs: what
  the data channel itself carries into one trainer;
- ``sync_ms_median`` (and ``sync_ms_p90``): publish to the last collector
  applying it. Collectors idle; before each publish a barrier, so nothing queues.

Speeds are compared within one run: start-up with 32 collectors against 2,
intake with 8 against 2, hierarchical against flat gloo over 2 nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEMES = {1: ["gloo", "shm", "hierarchical"], 2: ["gloo", "hierarchical"]}  # shm cannot span nodes
COLLECTORS = [2, 4, 8, 16, 32]


def worker(opts: dict) -> None:
    """One rank of a case (run by torchrun): rank 0 measures, the others collect."""
    import torch
    import torch.distributed as dist
    from hydra import compose, initialize_config_dir
    from torch import nn

    from harness.algos.ppo import PPO
    from harness.collect.envs import env_spec
    from harness.config import load, register_configs
    from harness.core.packing import pack_parameters_
    from harness.distributed.setup import init_distributed
    from harness.distributed.topology import Layout
    from harness.sync import SCHEMES as SCHEMES_BY_NAME

    marks = {"imported": time.monotonic_ns()}  # when this rank reached each stage of its start
    torch.set_num_threads(1)
    register_configs()
    with initialize_config_dir(version_base=None, config_dir=str(ROOT / "conf")):
        cfg = load(
            compose(
                "config",
                overrides=[
                    f"sync={opts['scheme']}",
                    "collector.mode=async",
                    "sync.timeout_s=300",
                    "dist_timeout_s=300",
                ],
            )
        )
    layout = Layout.from_env(1)
    marks["config"] = time.monotonic_ns()
    groups = init_distributed(layout, cfg.dist_timeout_s, SCHEMES_BY_NAME[cfg.sync.name])
    marks["groups"] = time.monotonic_ns()
    width = max(int((opts["params"] / 50) ** 0.5), 1)
    models = nn.ModuleDict(
        {
            "policy": PPO.make_policy(cfg.algo, env_spec(cfg.env.id)),
            "ballast": nn.Sequential(*[nn.Linear(width, width) for _ in range(50)]),
        }
    )
    pack_parameters_(models)  # one buffer, as an algorithm packs what it publishes
    run = trainer if layout.rank == 0 else collector
    result = run(cfg, layout, groups, models, opts)
    everyone: list = [None] * layout.world_size
    dist.all_gather_object(everyone, (marks, result))
    if layout.rank == 0:
        write_result(opts["out"], result, everyone)
    dist.destroy_process_group()


def write_result(out: str, result: dict, everyone: list) -> None:
    """Rank 0's ``result``, with when the last rank reached each stage of its start and each
    publish's latency to the last collector (``everyone``: every rank's ``(marks, result)``)."""
    latencies: dict[int, list[float]] = {}
    for _, lat in everyone[1:]:
        for version, ms in lat.items():
            latencies.setdefault(version, []).append(ms)
    last = [max(v) for v in latencies.values()]  # each publish: when the last collector had it
    marks = everyone[0][0]
    Path(out).write_text(
        json.dumps(
            {
                **result,
                "marks": {k: max(m[k] for m, _ in everyone) for k in marks},
                "sync_ms": last,
                "collectors": len(everyone) - 1,
            }
        )
    )


def trainer(cfg, layout, groups, models, opts) -> dict:
    import torch.distributed as dist

    from harness.collect.rollout import batch_template
    from harness.data.channel import BatchReceiver
    from harness.sync import Header, make_publisher

    publisher = make_publisher(cfg.sync, 0, groups)
    publisher.connect({"policy": models}, ("t0", "phase"))
    steps = cfg.collector.frames_per_batch // cfg.collector.num_envs
    template = batch_template(models["policy"], (4,), steps, cfg.collector.num_envs)
    receiver = BatchReceiver(groups.data, 0, layout.collector_ranks, template, cfg.dist_timeout_s)
    publisher.publish(Header(0, values={"t0": time.monotonic(), "phase": 0}))
    receiver.receive_any()
    first_batch_ns = time.monotonic_ns()
    start = time.monotonic()
    while time.monotonic() < start + opts["warmup_s"]:
        receiver.receive_any()
    intake = windows(receiver, opts["intake_s"])  # a trivial update: take the batch, nothing else
    # collectors stop stepping envs
    publisher.publish(Header(1, values={"t0": time.monotonic(), "phase": 1}))
    channel = windows(receiver, opts["intake_s"], skip_s=0.5)
    publisher.publish(Header(2, values={"t0": time.monotonic(), "phase": 2}))  # no more batches
    receiver.drain()
    # publish-to-applied: collectors idle, nothing queues
    for version in range(3, 3 + opts["samples"]):
        dist.barrier()
        last = version == 2 + opts["samples"]
        publisher.publish(Header(version, stop=last, values={"t0": time.monotonic(), "phase": 3}))
    publisher.close()
    return {
        "first_batch_ns": first_batch_ns,
        "intake": intake,
        "channel": channel,
        "payload_bytes": publisher.payload_bytes,
        "batch_bytes": receiver.any_wire.numel(),
        "frames_per_batch": cfg.collector.frames_per_batch,
    }


def windows(receiver, seconds: int, skip_s: float = 0.0) -> list[float]:
    """Frames taken per second, in 1-second windows (after ``skip_s`` of taking without
    counting)."""
    start = time.monotonic()
    while time.monotonic() < start + skip_s:
        receiver.receive_any()
    rates = []
    for _ in range(seconds):
        frames, window = 0, time.monotonic()
        while time.monotonic() < window + 1:
            frames += receiver.receive_any()["rollout"].numel()
        rates.append(frames / (time.monotonic() - window))
    return rates


def collector(cfg, layout, groups, models, opts) -> dict[int, float]:
    import torch.distributed as dist

    from harness.collect.envs import make_vec_env
    from harness.collect.rollout import RolloutCollector
    from harness.data.channel import BatchSender
    from harness.sync import make_subscriber

    subscriber = make_subscriber(cfg.sync, layout.rank, groups)
    subscriber.connect({"policy": models}, ("t0", "phase"))
    envs = make_vec_env(cfg.env.id, cfg.collector.num_envs)
    rollout = RolloutCollector(
        envs, models["policy"], cfg.collector.frames_per_batch, layout.rank * 100
    )
    sender = BatchSender(groups.data, layout.rank, 0, rollout.batch, cfg.dist_timeout_s)
    header = subscriber.wait(0)
    while header.values["phase"] == 0:  # async mode's loop: the newest weights before every step
        batch = rollout.collect(
            header, refresh=lambda: subscriber.poll() or subscriber.current_header()
        )
        sender.send(batch, while_waiting=subscriber.poll)
        header = subscriber.poll() or subscriber.current_header()
    while header.values["phase"] == 1:  # the channel alone: the same batch again, no env steps
        sender.send(rollout.batch, while_waiting=subscriber.poll)
        header = subscriber.poll() or subscriber.current_header()
    sender.send_last(rollout.batch)
    latencies = {}
    for version in range(3, 3 + opts["samples"]):
        dist.barrier()
        header = subscriber.wait(version)
        latencies[version] = 1000 * (time.monotonic() - header.values["t0"])
    subscriber.close()
    envs.close()
    return latencies


def torchrun_commands(
    nodes, collectors: int, scheme: str, script: list[str], env: dict, pair=None
) -> list[tuple[list[str], dict]]:
    """``(command, environment)`` of each node's torchrun: 1 trainer + ``collectors``."""
    torchrun = str(Path(sys.executable).parent / "torchrun")
    if nodes == 1:
        return [([torchrun, "--standalone", f"--nproc_per_node={collectors + 1}", *script], env)]
    head = pair[0]
    return [
        (
            node.torchrun(
                i, head, collectors // 2 + (i == 0), script, run_id=f"scale-{scheme}-{collectors}"
            ),
            {**env, **node.env()},
        )
        for i, node in enumerate(pair)
    ]


def launch(nodes, collectors: int, scheme: str, opts: dict, pair=None) -> dict:
    """One case through the real torchrun (a pair of them on two namespaces); its row."""
    with tempfile.TemporaryDirectory() as tmp:
        opts = {**opts, "scheme": scheme, "out": f"{tmp}/result.json"}
        script = [str(Path(__file__).resolve()), "--worker", json.dumps(opts)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        launched_ns = time.monotonic_ns()
        commands = torchrun_commands(nodes, collectors, scheme, script, env, pair)
        procs = [
            subprocess.Popen(
                cmd, env=e, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
            for cmd, e in commands
        ]
        errors = [p.communicate(timeout=1800)[1] for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError(
                f"{scheme} with {collectors} collectors on {nodes} node(s) failed:\n"
                + errors[0][-3000:]
            )
        result = json.loads(Path(opts["out"]).read_text())
    last = result["sync_ms"][1:]  # the first publish of the phase warms up connections and caches
    return {
        "collectors": collectors,
        "nodes": nodes,
        "scheme": scheme,
        "startup_s": (result["first_batch_ns"] - launched_ns) / 1e9,
        "after_imports_s": (result["first_batch_ns"] - result["marks"]["imported"]) / 1e9,
        # when the last rank had imported, composed its config and made its process groups (from the
        # launch)
        **{f"{k}_s": (ns - launched_ns) / 1e9 for k, ns in result["marks"].items()},
        "sync_ms_median": statistics.median(last),
        "sync_ms_p90": statistics.quantiles(last, n=10)[-1],
        "intake_frames_per_s": statistics.median(result["intake"]),
        "channel_frames_per_s": statistics.median(result["channel"]),
        "channel_mb_per_s": statistics.median(result["channel"])
        / result["frames_per_batch"]
        * result["batch_bytes"]
        / 1e6,
        "payload_bytes": result["payload_bytes"],
        "batch_bytes": result["batch_bytes"],
    }


def ratios(rows: list[dict]) -> list[str]:
    """The issue's targets, as ratios within this run."""

    def get(nodes, collectors, scheme, key):
        return next(
            (
                r[key]
                for r in rows
                if (r["nodes"], r["collectors"], r["scheme"]) == (nodes, collectors, scheme)
            ),
            None,
        )

    lines = []
    for nodes, schemes in SCHEMES.items():
        for scheme in schemes:
            for key, (a, b), target in (
                ("startup_s", (32, 2), "<= 4"),
                ("after_imports_s", (32, 2), ""),
                ("intake_frames_per_s", (8, 2), ">= 0.8"),
                ("channel_frames_per_s", (8, 2), ""),
            ):
                x, y = get(nodes, a, scheme, key), get(nodes, b, scheme, key)
                if x and y:
                    lines.append(
                        f"{nodes} node(s) {scheme:>12}: {key} {a} / {b} collectors "
                        f"= {x / y:.2f} {target}"
                    )
    h, g = get(2, 16, "hierarchical", "sync_ms_median"), get(2, 16, "gloo", "sync_ms_median")
    if h and g:
        lines.append(
            f"2 nodes, 16 collectors: sync_ms hierarchical / gloo = {h / g:.2f} (target <= 0.6)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 2 collectors, short phases"
    )
    parser.add_argument("--collectors", type=int, nargs="+", help=f"default {COLLECTORS}")
    parser.add_argument(
        "--schemes", nargs="+", help="default: gloo shm hierarchical (2 nodes: gloo hierarchical)"
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2], choices=[1, 2])
    parser.add_argument(
        "--params", type=int, default=1_000_000, help="ballast parameters published with the policy"
    )
    parser.add_argument(
        "--intake-s", type=int, help="seconds of intake measured (default 8; quick 2)"
    )
    parser.add_argument("--samples", type=int, help="publishes timed (default 20; quick 5)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    opts = {
        "params": args.params,
        "warmup_s": 1 if args.quick else 3,
        "intake_s": args.intake_s or (2 if args.quick else 8),
        "samples": args.samples or (5 if args.quick else 20),
    }
    collectors = args.collectors or ([2] if args.quick else COLLECTORS)
    rows = []
    with ExitStack() as stack:
        pair = None
        if 2 in args.nodes:
            from harness.testing import netns

            try:
                pair = stack.enter_context(netns.two_nodes("b"))
            except netns.NamespaceError as e:
                print(f"skipping 2 nodes: {e}", flush=True)
        # the smaller sizes first, on both layouts: a run cut short still has its pairs
        for n in collectors:
            for nodes in [k for k in args.nodes if k == 1 or pair is not None]:
                for scheme in [s for s in args.schemes or SCHEMES[nodes] if s in SCHEMES[nodes]]:
                    rows.append(launch(nodes, n, scheme, opts, pair))
                    r = rows[-1]
                    print(
                        f"{nodes} node(s) {n:>3} collectors {scheme:>12}: start-up "
                        f"{r['startup_s']:6.1f} s ({r['after_imports_s']:5.1f} s after imports)  "
                        f"sync {r['sync_ms_median']:8.2f} ms (p90 {r['sync_ms_p90']:8.2f})  intake "
                        f"{r['intake_frames_per_s']:9,.0f} frames/s  channel "
                        f"{r['channel_frames_per_s']:9,.0f} frames/s",
                        flush=True,
                    )
                    if args.json:  # after every case
                        Path(args.json).write_text(json.dumps(rows, indent=1))
    print("\n" + "\n".join(ratios(rows)))


if __name__ == "__main__":
    main()
