"""Publish-to-applied latency of every weight sync scheme that runs here.

    python benchmarks/weight_sync.py --json bench-weight_sync.json \\
        [--sizes 100000 1000000 10000000] [--repeats 3]
    python benchmarks/weight_sync.py --publisher-device cuda --sizes 10000000 \\
        --schemes d2h gloo shm hierarchical

Real spawned ranks: one publisher (rank 0) and two subscribers. Each sample:
rank 0 stamps the clock, publishes, and every subscriber notes when the update
is applied to its policy; a barrier separates samples, so nothing queues. The
clock is CLOCK_MONOTONIC, shared by all processes of a machine.

References measured in the same run:

- ``memcpy``: one in-process, cache-hot copy of the same bytes. It moves
  between runs (0.04 ms at 1M one day, 0.30 ms another), so ratios to it swing;
- ``shm_copy_ack``: the cross-process floor. The publisher copies its packed
  parameters into a shared-memory buffer and bumps a word there; each
  subscriber, asleep on that word (a futex, as ``shm`` readers wait), wakes,
  notes the time and acknowledges. No scheme that moves the bytes to another
  process can beat it: it is one copy and one wake-up, with no locking,
  no header and no protocol;
- ``gloo_per_param``: one Gloo broadcast per tensor: the naive way, close to
  TorchRL's distributed weight updater.

Models hold about ``params`` float32 parameters as 100 tensors (50 linear layers).
With ``--repeats N`` every scheme is launched N times, the schemes taking
turns, and a row's median is the median of the launches' medians: on a machine
whose load drifts, a ratio of neighbours in time holds better than one of
launches minutes apart.

``--publisher-device cuda``: rank 0's model lives on its GPU (a GPU trainer
with CPU collectors: each publish is one device-to-host copy into pinned
memory, then the scheme's transport); the reference ``d2h`` is a plain
device-to-host copy of the same bytes into pinned memory, in one process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from harness.core.packing import pack_parameters_
from harness.distributed.setup import init_distributed
from harness.distributed.topology import Layout
from harness.sync import SCHEMES as SCHEMES_BY_NAME
from harness.sync import Header, WeightPublisher, futex, make_publisher, make_subscriber, shm_files
from harness.sync.config import SyncConfig
from harness.testing.spawn import run_ranks

SCHEMES = ["gloo", "shm", "hierarchical"]
REFERENCES = ["shm_copy_ack", "gloo_per_param"]  # measured by spawned ranks like the schemes


def make_model(params: int) -> nn.Module:
    width = max(int(math.sqrt(params / 50)), 1)
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(50)])


def scheme_rank(
    rank: int, world: int, scheme: str, params: int, samples: int, device: str = "cpu"
) -> list[float]:
    torch.set_num_threads(1)
    groups = init_distributed(Layout.from_env(1), 60, SCHEMES_BY_NAME[scheme])
    model = make_model(params)
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
    cfg = SyncConfig(name=scheme, timeout_s=60, poll_interval_s=0.0001)
    end = make_publisher(cfg, rank, groups) if rank == 0 else make_subscriber(cfg, rank, groups)
    end.connect({"policy": model}, ("t0",))
    latencies = []
    for version in range(samples):
        dist.barrier()
        if isinstance(end, WeightPublisher):
            end.publish(
                Header(version, stop=version == samples - 1, values={"t0": time.monotonic()})
            )
        else:
            header = end.wait(version)
            latencies.append(1000 * (time.monotonic() - header.values["t0"]))
    dist.barrier()
    end.close()
    return latencies


def per_param_rank(rank: int, world: int, params: int, samples: int) -> list[float]:
    torch.set_num_threads(1)
    init_distributed(Layout.from_env(1), 60)
    tensors = [p.data for p in make_model(params).parameters()]
    stamp = torch.zeros(1, dtype=torch.float64)
    latencies = []
    for _ in range(samples):
        dist.barrier()
        if rank == 0:
            stamp.fill_(time.monotonic())
        dist.broadcast(stamp, src=0)
        for t in tensors:
            dist.broadcast(t, src=0)
        if rank:
            latencies.append(1000 * (time.monotonic() - float(stamp)))
    dist.barrier()
    return latencies


def copy_ack_rank(rank: int, world: int, params: int, samples: int) -> list[float]:
    """``shm_copy_ack``: rank 0 copies into shared memory and rings; every other rank wakes, notes
    the time, acknowledges."""
    from multiprocessing import shared_memory

    torch.set_num_threads(1)
    # barriers between samples, and the buffer's name; never in what is timed
    init_distributed(Layout.from_env(1), 60)
    # one buffer, as a trainer's
    packed = next(pack_parameters_(make_model(params)).parameters()).untyped_storage()
    source = torch.empty(0, dtype=torch.uint8).set_(packed)  # type: ignore[call-overload]
    # the harness's own naming: its stale-segment clean-up also finds this one
    name = [shm_files.new_name(0)]
    dist.broadcast_object_list(name, src=0)
    offset = -(-(3 + world) * 8 // 64) * 64
    if rank == 0:
        region = shared_memory.SharedMemory(name=name[0], create=True, size=offset + source.numel())
    dist.barrier()
    if rank:
        region = shared_memory.SharedMemory(name=name[0])
    try:
        return copy_ack_samples(rank, world, region.buf, offset, source, samples)
    finally:  # also after a failure: no segment outlives the benchmark
        if rank == 0:
            region.unlink()
        # a failure's traceback may still hold views of the buffer
        with contextlib.suppress(BufferError):
            region.close()


def copy_ack_samples(
    rank: int, world: int, buf, offset: int, source: torch.Tensor, samples: int
) -> list[float]:
    # [version, acknowledgement bell, the publish's clock in ns, the version each subscriber
    # acknowledged...]
    control = np.ndarray((3 + world,), dtype=np.int64, buffer=buf)
    target = torch.frombuffer(buf, dtype=torch.uint8, count=source.numel(), offset=offset)
    bell, ack_bell = control.ctypes.data, control.ctypes.data + 8
    latencies = []
    dist.barrier()
    for version in range(1, samples + 1):
        dist.barrier()
        if rank == 0:
            control[2] = time.monotonic_ns()
            target.copy_(source)
            control[0] = version
            futex.wake(bell)
            while True:
                # before looking: an acknowledgement after it ends the sleep at once
                rung = int(control[1])
                if all(control[3 + r] == version for r in range(1, world)):
                    break
                futex.wait(ack_bell, rung, 1.0)
        else:
            while int(control[0]) < version:
                futex.wait(bell, version - 1, 1.0)
            latencies.append((time.monotonic_ns() - int(control[2])) / 1e6)
            control[3 + rank] = version
            control[1] += (
                # not atomic: two subscribers may add one between them, but the word changes, which
                # is all a sleeper needs
                1
            )
            futex.wake(ack_bell)
    dist.barrier()
    return latencies


def memcpy(params: int, samples: int, source: str = "cpu") -> list[float]:
    """One copy of the model's bytes into CPU memory (pinned when ``source`` is a GPU: the ``d2h``
    reference)."""
    torch.set_num_threads(1)
    nbytes = sum(p.numel() * 4 for p in make_model(params).parameters())
    gpu = source.startswith("cuda")
    src = torch.ones(nbytes, dtype=torch.uint8, device=source)
    dst = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=gpu)
    out = []
    for _ in range(samples):
        start = time.monotonic()
        dst.copy_(src)  # from a GPU into pinned memory: complete when it returns
        out.append(1000 * (time.monotonic() - start))
    return out


def gather(results: dict) -> list[float]:
    latencies = []
    for rank, (status, value) in results.items():
        if status != "ok":
            raise RuntimeError(f"rank {rank}: {status}: {value}")
        if rank:
            latencies += value[2:]  # the first samples warm up connections and caches
    return latencies


def measure(
    scheme: str, world: int, params: int, samples: int, publisher: str = "cpu"
) -> list[float]:
    """One launch of ``scheme`` (or a reference) with rank 0's model on ``publisher``: the
    subscribers' latencies, ms."""
    if scheme == "d2h":
        return memcpy(params, samples * 5, publisher)[5:]
    if scheme == "gloo_per_param":
        return gather(run_ranks(per_param_rank, world, params, samples, timeout=600))
    if scheme == "shm_copy_ack":
        return gather(run_ranks(copy_ack_rank, world, params, samples, timeout=600))
    return gather(run_ranks(scheme_rank, world, scheme, params, samples, publisher, timeout=600))


def row(scheme: str, params: int, runs: list[list[float]]) -> dict:
    """``median_ms``: the median over launches of each launch's median; ``p90_ms`` over every
    sample."""
    q = statistics.quantiles([ms for run in runs for ms in run], n=10)
    medians = [statistics.median(run) for run in runs]
    return {
        "scheme": scheme,
        "params": params,
        "tensors": 100,
        "median_ms": statistics.median(medians),
        "p90_ms": q[-1],
        "launch_medians_ms": medians,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--subscribers", type=int, default=2)
    parser.add_argument(
        "--schemes",
        nargs="+",
        default=[*REFERENCES, *SCHEMES],
        help="shm_copy_ack, gloo_per_param, gloo, shm, hierarchical; "
        "d2h: the plain device-to-host copy (with a GPU publisher)",
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
        help="launches of every scheme, interleaved (the median of their medians)",
    )
    return parser.parse_args()


def size_rows(params: int, args: argparse.Namespace) -> list[dict]:
    """The rows of one model size: memcpy's, then every scheme's, each printed."""
    samples = args.samples if params <= 1_000_000 else max(args.samples // 3, 8)
    rows = [row("memcpy", params, [memcpy(params, samples * 5)[5:]])]
    runs: dict[str, list[list[float]]] = {scheme: [] for scheme in args.schemes}
    # interleaved: neighbours in time see the same load on a shared machine
    for _ in range(args.repeats):
        for scheme in args.schemes:
            runs[scheme].append(
                measure(scheme, 1 + args.subscribers, params, samples, args.publisher_device)
            )
    rows += [
        {**row(scheme, params, runs[scheme]), "publisher": args.publisher_device}
        for scheme in args.schemes
    ]
    for r in rows:
        print(
            f"{r['scheme']:>15} {r['params']:>10,} params  median {r['median_ms']:9.3f} ms  "
            f"p90 {r['p90_ms']:9.3f} ms",
            flush=True,
        )
    return rows


def print_ratios(rows: list[dict], args: argparse.Namespace) -> None:
    """Each scheme's median against the references' (d2h, shm_copy_ack, memcpy) run with it."""

    def median(scheme, params):
        return next(r["median_ms"] for r in rows if r["scheme"] == scheme and r["params"] == params)

    if "d2h" in args.schemes:
        for params in args.sizes:
            print(
                f"  {params:>10,}: "
                + "   ".join(
                    f"{s}/d2h {median(s, params) / median('d2h', params):5.2f}x"
                    for s in args.schemes
                    if s != "d2h"
                )
            )
    print("\nratios of medians: each scheme / shm_copy_ack (the cross-process floor), and / memcpy")
    for params in args.sizes if "shm_copy_ack" in args.schemes else []:
        print(
            f"  {params:>10,}: "
            + "   ".join(
                f"{scheme} {median(scheme, params) / median('shm_copy_ack', params):.2f}x "
                f"({median(scheme, params) / median('memcpy', params):.1f}x)"
                for scheme in args.schemes
                if scheme != "shm_copy_ack"
            )
        )
    for params in args.sizes if {"gloo_per_param", "gloo"} <= set(args.schemes) else []:
        print(
            f"  {params:>10,}: gloo_per_param/gloo "
            f"{median('gloo_per_param', params) / median('gloo', params):.1f}x"
        )


def main() -> None:
    args = parse_args()
    rows = []
    for params in args.sizes:
        rows += size_rows(params, args)
    print_ratios(rows, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
