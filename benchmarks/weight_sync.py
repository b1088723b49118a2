"""Publish-to-applied latency, throughput and memory of every weight sync scheme that runs here.

    python benchmarks/weight_sync.py --json bench-weight_sync.json \\
        [--sizes 100000 1000000 10000000] [--collectors 1 2] [--repeats 3]
    python benchmarks/weight_sync.py --sizes 100000000 --schemes gloo --bucket-mb 0 4 32 128
    python benchmarks/weight_sync.py --sizes 100000000 --schemes gloo shm --verify off every
    python benchmarks/weight_sync.py --publisher-device cuda --sizes 10000000 \\
        --schemes d2h gloo shm hierarchical

Real spawned ranks: one publisher (rank 0) and ``--collectors`` subscribers. Each sample:
rank 0 stamps the clock, publishes, and every subscriber notes when the update
is applied to its policy; a barrier separates samples, so nothing queues. The
clock is CLOCK_MONOTONIC, shared by all processes of a machine. ``--bucket-mb``
and ``--verify`` are ``sync.bucket_mb`` and ``sync.verify``; given several values,
every combination is measured.

Floors and references measured in the same run (``benchmarks/weight_sync_floors.py``):
``memcpy`` (one in-process, cache-hot copy of the same bytes: the floor of ``shm``
and ``hierarchical``), ``tcp`` (raw loopback TCP from rank 0 to every collector at
once: the floor of ``gloo``), ``shm_copy_ack`` (a copy into shared memory and a
futex wake-up: the cross-process floor) and ``gloo_per_param`` (one Gloo broadcast
per tensor, close to TorchRL's distributed weight updater). Each row reports its
median latency, GB/s (the model's bytes over the median: one copy of them, whatever
the number of collectors) and its ratio to its floor.

Memory, per launch: every rank's peak RSS over its whole life (``getrusage``, which
counts the shared-memory pages it touched, and the transient copies of start-up:
packing, the schema handshake, the payloads), and the trainer's peak during the
measured publishes. After the warm-up each rank frees what start-up left behind,
reported as it goes: ``garbage`` (payloads in reference cycles, which Python's cyclic
collector frees when it chooses to run) and ``retained`` (freed memory glibc kept,
``malloc_trim``); then its peak RSS is reset (writing 5 to ``/proc/self/clear_refs``,
which resets ``ru_maxrss`` too: read before). ``trainer_publish_extra_mb``: the
trainer's peak during the measured publishes less the model alone (its RSS before
the model was made plus the model's bytes), i.e. what the scheme holds and what a
publish allocates, shared memory it mapped included (``trainer_shmem_mb`` of it).

Models hold about ``params`` parameters as 100 tensors (50 linear layers), float32
below ``--bf16-from`` parameters and bfloat16 from there (1B float32 parameters
with 2 collectors needs more than this 24 GiB machine has: a full copy in the
trainer and in each collector, their staging copies and an shm segment of
collectors + 2 slots). A launch whose estimated peak exceeds the memory available
is skipped, saying so. With ``--repeats N`` every configuration is launched N
times, taking turns, and a row's median is the median of the launches' medians.

``--publisher-device cuda``: rank 0's model lives on its GPU (a GPU trainer
with CPU collectors: each publish is one device-to-host copy into pinned
memory, then the scheme's transport); the reference ``d2h`` is a plain
device-to-host copy of the same bytes into pinned memory, in one process.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import torch
import torch.distributed as dist
from weight_sync_floors import (
    MB,
    PROCESS_GROUP_TIMEOUT_S,
    copy_ack_rank,
    cpu_clock,
    first_for_the_oom_killer,
    fits,
    make_model,
    maxrss_mb,
    memcpy,
    model_bytes,
    per_param_rank,
    release_start_up_memory,
    reset_peak,
    status_mb,
    tcp_rank,
)

from harness.core.packing import pack_parameters_
from harness.distributed.setup import init_distributed
from harness.distributed.topology import Layout
from harness.sync import SCHEMES as SCHEMES_BY_NAME
from harness.sync import Header, WeightPublisher, make_publisher, make_subscriber
from harness.sync.config import SyncConfig
from harness.testing.spawn import run_ranks

SCHEMES = ["gloo", "shm", "hierarchical"]
REFERENCES = ["tcp", "shm_copy_ack", "gloo_per_param"]  # spawned ranks, like the schemes
FLOOR = {"gloo": "tcp", "gloo_per_param": "tcp", "shm": "memcpy", "hierarchical": "memcpy"}
FLOOR |= {"shm_copy_ack": "memcpy", "tcp": "memcpy"}
LARGE = 500_000_000  # from here a publish takes seconds: few samples, one warm-up


def scheme_rank(
    rank: int,
    world: int,
    scheme: str,
    params: int,
    dtype: torch.dtype,
    warmup: int,
    samples: int,
    settings: dict,
    device: str = "cpu",
) -> dict:
    """One rank of a launch of ``scheme`` with ``settings`` (``sync.*``): its latencies, ms, and
    its memory (see the module docstring)."""
    first_for_the_oom_killer()
    groups = init_distributed(Layout.from_env(1), PROCESS_GROUP_TIMEOUT_S, SCHEMES_BY_NAME[scheme])
    # the model's own memory, counted exactly: packing's freed copies may still be resident later
    on_host = model_bytes(params, dtype) / MB if rank or device == "cpu" else 0.0
    memory = {"model_mb": status_mb("VmRSS") + on_host}
    model = make_model(params, dtype)
    if rank == 0:
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device).index or 0)
        # as the algorithms do with what they publish, on the trainer's device
        pack_parameters_(model.to(device))
        where = {str(p.device) for p in model.parameters()}
        if where != {str(torch.device(device, 0) if device == "cuda" else torch.device(device))}:
            raise RuntimeError(
                f"the publisher's weights should be on {device}, but they are on {sorted(where)}"
            )
    cfg = SyncConfig(name=scheme, timeout_s=300, poll_interval_s=0.0001, **settings)
    end = make_publisher(cfg, rank, groups) if rank == 0 else make_subscriber(cfg, rank, groups)
    end.connect({"policy": model}, ("t0",))
    latencies = []
    for version in range(warmup + samples):
        if version == warmup:  # the peak of the measured publishes, not of start-up's copies
            memory |= {"start_maxrss_mb": maxrss_mb(), "steady_mb": status_mb("VmRSS")}
            memory["garbage_mb"], memory["retained_mb"] = release_start_up_memory()
            memory["peak_reset"] = reset_peak()
            clock = cpu_clock()
        dist.barrier()
        if isinstance(end, WeightPublisher):
            end.publish(
                Header(
                    version, stop=version == warmup + samples - 1, values={"t0": time.monotonic()}
                )
            )
        else:
            header = end.wait(version)
            latencies.append(1000 * (time.monotonic() - header.values["t0"]))
    dist.barrier()
    cpu_ms, voluntary, involuntary = (b - a for a, b in zip(clock, cpu_clock()))
    memory |= {"cpu_ms": cpu_ms / samples, "switches": (voluntary + involuntary) / samples}
    memory |= {"publish_peak_mb": status_mb("VmHWM"), "shmem_mb": status_mb("RssShmem")}
    end.close()
    maxrss = max(memory.pop("start_maxrss_mb"), maxrss_mb())  # the reset cleared ru_maxrss too
    return {"ms": latencies, "maxrss_mb": maxrss, "memory": memory}


def plan(config: dict, args: argparse.Namespace) -> tuple[int, int]:
    """A launch's warm-up publishes and measured ones. The warm-up covers connections, caches,
    the first publish's allocations and, for shared memory, a first write into every slot (the
    writer's first touch of a slot's pages costs about 3 ms a MB here, once)."""
    params, collectors = config["params"], config["collectors"] or 0
    slots = collectors + 2 if config["scheme"] in ("shm", "hierarchical") else 0
    if params >= LARGE:
        return max(1, slots), args.large_samples
    return max(2, slots), args.samples if params <= 1_000_000 else max(args.samples // 3, 8)


def gather(results: dict, warmup: int) -> dict:
    """A launch's ranks' results: the collectors' latencies after the warm-up, every rank's peak
    RSS, the trainer's memory."""
    out: dict = {"ms": [], "maxrss_mb": {}}
    for rank, (status, value) in sorted(results.items()):
        if status != "ok":
            raise RuntimeError(f"rank {rank}: {status}: {value}")
        out["maxrss_mb"][rank] = value["maxrss_mb"]
        if rank:
            out["ms"] += value["ms"][warmup:]
            out.setdefault("warmup_ms", []).append(value["ms"][:warmup])
            if "memory" in value:
                out.setdefault("collector_memory", []).append(value["memory"])
        elif "memory" in value:
            out["memory"] = value["memory"]
    return out


def measure(config: dict, args: argparse.Namespace) -> dict:
    """One launch of ``config``'s scheme (or reference) with rank 0's model on the publisher
    device."""
    scheme, collectors = config["scheme"], config["collectors"] or 0
    params, dtype = config["params"], config["dtype"]
    warmup, samples = plan(config, args)
    nbytes, world, total = model_bytes(params, dtype), 1 + collectors, warmup + samples
    if scheme in ("memcpy", "d2h"):
        source = "cpu" if scheme == "memcpy" else args.publisher_device
        return {"ms": memcpy(nbytes, warmup, samples, source)}
    if scheme == "tcp":
        results = run_ranks(tcp_rank, world, nbytes, total, timeout=600)
    elif scheme == "gloo_per_param":
        results = run_ranks(per_param_rank, world, params, dtype, total, timeout=600)
    elif scheme == "shm_copy_ack":
        results = run_ranks(copy_ack_rank, world, params, dtype, total, timeout=600)
    else:
        settings = {"bucket_mb": config["bucket_mb"], "verify": config["verify"]}
        run = (scheme, params, dtype, warmup, samples, settings, args.publisher_device)
        results = run_ranks(scheme_rank, world, *run, timeout=600)
    return gather(results, warmup)


def row(config: dict, runs: list[dict]) -> dict:
    """``median_ms``: the median over launches of each launch's median; ``p90_ms`` and
    ``mean_ms`` over every sample; memory: the largest over launches."""
    samples = [ms for run in runs for ms in run["ms"]]
    medians = [statistics.median(run["ms"]) for run in runs]
    nbytes = model_bytes(config["params"], config["dtype"])
    out = {
        **config,
        "dtype": str(config["dtype"]).removeprefix("torch."),
        "bytes": nbytes,
        "tensors": 100,
        "median_ms": statistics.median(medians),
        "p90_ms": statistics.quantiles(samples, n=10)[-1] if len(samples) > 1 else samples[0],
        "mean_ms": statistics.fmean(samples),
        "gb_s": nbytes / statistics.median(medians) / 1e6,
        "launch_medians_ms": medians,
    }
    if "warmup_ms" in runs[0]:  # the first launch's, each version's median over collectors
        out["warmup_ms"] = [statistics.median(v) for v in zip(*runs[0]["warmup_ms"])]
    if "maxrss_mb" in runs[0]:
        ranks = sorted(runs[0]["maxrss_mb"])
        peaks = [max(run["maxrss_mb"][r] for run in runs) for r in ranks]
        out |= {"trainer_maxrss_mb": peaks[0], "collector_maxrss_mb": peaks[1:]}
    memories = [run["memory"] for run in runs if "memory" in run]
    if memories and all(m["peak_reset"] for m in memories):
        extras = [m["publish_peak_mb"] - m["model_mb"] for m in memories]
        out |= {
            "trainer_model_mb": memories[0]["model_mb"],
            "trainer_garbage_mb": max(m["garbage_mb"] for m in memories),
            "trainer_retained_mb": max(m["retained_mb"] for m in memories),
            "trainer_publish_extra_mb": max(extras),
            "trainer_publish_extra_launches_mb": extras,
            "trainer_shmem_mb": max(m["shmem_mb"] for m in memories),
            # per measured publish, barriers included: medians over launches
            "trainer_cpu_ms": statistics.median(m["cpu_ms"] for m in memories),
            "collector_cpu_ms": statistics.median(
                m["cpu_ms"] for run in runs for m in run["collector_memory"]
            ),
            "collector_garbage_mb": max(
                m["garbage_mb"] for run in runs for m in run["collector_memory"]
            ),
            "collector_steady_mb": max(
                m["steady_mb"] - m["garbage_mb"] - m["retained_mb"]
                for run in runs
                for m in run["collector_memory"]
            ),
        }
    return out


def configs_of(params: int, args: argparse.Namespace) -> list[dict]:
    """Every launch of one model size: each scheme with each collector count and each setting,
    each reference with each collector count."""
    dtype = torch.bfloat16 if params >= args.bf16_from else torch.float32
    settings = [
        {"bucket_mb": b, "verify": v} for b, v in itertools.product(args.bucket_mb, args.verify)
    ]
    configs = [{"scheme": "memcpy", "params": params, "dtype": dtype, "collectors": None}]
    for collectors, scheme in itertools.product(args.collectors, args.schemes):
        if scheme == "d2h" and collectors != args.collectors[0]:
            continue  # one process: no collectors
        base = {"scheme": scheme, "params": params, "dtype": dtype, "collectors": collectors}
        configs += [base | s for s in settings] if scheme in SCHEMES else [base]
    return configs


def add_floors(rows: list[dict]) -> None:
    """Each row's ratio to its floor (``FLOOR``) and, for shared memory, to ``shm_copy_ack``."""

    def median(scheme: str, like: dict) -> float | None:
        for r in rows:
            same = scheme == "memcpy" or r["collectors"] == like["collectors"]
            if r["scheme"] == scheme and r["params"] == like["params"] and same:
                return r["median_ms"]
        return None

    for r in rows:
        floor = FLOOR.get(r["scheme"])
        if floor and (ms := median(floor, r)):
            r |= {"floor": floor, "x_floor": r["median_ms"] / ms}
        if r["scheme"] in ("shm", "hierarchical") and (ms := median("shm_copy_ack", r)):
            r["x_shm_copy_ack"] = r["median_ms"] / ms


def line(r: dict) -> str:
    settings = f" bucket {r['bucket_mb']:g} MiB verify {r['verify']}" if "verify" in r else ""
    text = (
        f"{r['scheme']:>14} {r['params']:>13,} {r['dtype']:>8} "
        f"{r.get('collectors') or '-'} coll{settings}: median {r['median_ms']:9.3f} ms "
        f"p90 {r['p90_ms']:9.3f}  {r['gb_s']:6.2f} GB/s"
    )
    if "floor" in r:
        text += f"  {r['x_floor']:5.2f}x {r['floor']}"
    if "trainer_publish_extra_mb" in r:
        text += (
            f"  trainer +{r['trainer_publish_extra_mb']:.0f} MiB in publishes "
            f"(shm {r['trainer_shmem_mb']:.0f}; before: garbage {r['trainer_garbage_mb']:.0f}, "
            f"retained {r['trainer_retained_mb']:.0f})"
        )
    if "trainer_cpu_ms" in r:
        text += f"  CPU a publish {r['trainer_cpu_ms']:.1f}/{r['collector_cpu_ms']:.1f} ms"
    if "trainer_maxrss_mb" in r:
        peaks = "/".join(f"{m:.0f}" for m in [r["trainer_maxrss_mb"], *r["collector_maxrss_mb"]])
        text += f"  peak RSS {peaks} MiB"
    return text


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument(
        "--samples", type=int, default=40, help="measured publishes a launch up to 1M parameters"
    )
    parser.add_argument(
        "--large-samples", type=int, default=3, help=f"measured publishes from {LARGE:,} params"
    )
    parser.add_argument("--collectors", "--subscribers", type=int, nargs="+", default=[2])
    parser.add_argument(
        "--schemes",
        nargs="+",
        default=[*REFERENCES, *SCHEMES],
        help="tcp, shm_copy_ack, gloo_per_param, gloo, shm, hierarchical; "
        "d2h: the plain device-to-host copy (with a GPU publisher)",
    )
    parser.add_argument(
        "--bucket-mb", type=float, nargs="+", default=[SyncConfig.bucket_mb], help="sync.bucket_mb"
    )
    parser.add_argument("--verify", nargs="+", default=[SyncConfig.verify], help="sync.verify")
    parser.add_argument(
        "--bf16-from",
        type=int,
        default=LARGE,
        help="models of at least this many parameters hold bfloat16 parameters",
    )
    parser.add_argument(
        "--publisher-device",
        default="cpu",
        help="where rank 0's model lives: cpu, or cuda (a GPU trainer)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="launches of every configuration, interleaved (the median of their medians)",
    )
    return parser.parse_args()


def size_rows(params: int, args: argparse.Namespace) -> list[dict]:
    """The rows of one model size: memcpy's, then every configuration's, each printed."""
    configs = configs_of(params, args)
    dtype = configs[0]["dtype"]
    nbytes = model_bytes(params, dtype)
    print(f"{params:,} parameters as {dtype}: {nbytes / 1e9:.3f} GB a copy", flush=True)
    runs: list[list[dict]] = [[] for _ in configs]
    # interleaved: neighbours in time see the same load on a shared machine
    for _ in range(args.repeats):
        for config, done in zip(configs, runs):
            ok, text = fits(config["scheme"], config["collectors"] or 0, nbytes)
            if not ok:
                print(f"{config['scheme']:>14} {config['collectors']} coll: skipped, {text}")
                continue
            done.append(measure(config, args))
    rows = [
        row(config, done) | {"publisher": args.publisher_device}
        for config, done in zip(configs, runs)
        if done
    ]
    add_floors(rows)
    for r in rows:
        print(line(r), flush=True)
    return rows


def main() -> None:
    args = parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}: {vars(args)}", flush=True)
    rows = []
    for params in args.sizes:
        rows += size_rows(params, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
