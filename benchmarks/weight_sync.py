"""Publish-to-applied latency of every weight sync scheme that runs here.

    python benchmarks/weight_sync.py --json bench-weight_sync.json [--sizes 100000 1000000 10000000]

Real spawned ranks: one publisher (rank 0) and two subscribers. Each sample:
rank 0 stamps the clock, publishes, and every subscriber notes when the update
is applied to its policy; a barrier separates samples, so nothing queues. The
clock is CLOCK_MONOTONIC, shared by all processes of a machine.

References measured in the same run: ``memcpy`` (one in-process copy of the
same bytes: the physical limit) and ``gloo_per_param`` (one Gloo broadcast per
tensor: the naive way, close to TorchRL's distributed weight updater).
Models hold about ``params`` float32 parameters as 100 tensors (50 linear layers).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from harness.distributed.setup import init_distributed
from harness.distributed.spawn import run_ranks
from harness.distributed.topology import Layout
from harness.packing import pack_parameters_
from harness.sync import Header, make_publisher, make_subscriber
from harness.sync.config import SyncConfig

SCHEMES = ["gloo", "shm", "hierarchical"]


def make_model(params: int) -> nn.Module:
    width = max(int(math.sqrt(params / 50)), 1)
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(50)])


def scheme_rank(rank: int, world: int, scheme: str, params: int, samples: int) -> list[float]:
    torch.set_num_threads(1)
    groups = init_distributed(Layout.from_env(1), 60)
    model = make_model(params)
    if rank == 0:
        pack_parameters_(model)  # as the algorithms do with what they publish
    cfg = SyncConfig(name=scheme, timeout_s=60, poll_interval_s=0.0001)
    end = make_publisher(cfg, rank, groups) if rank == 0 else make_subscriber(cfg, rank, groups)
    end.connect({"policy": model}, ("t0",))
    latencies = []
    for version in range(samples):
        dist.barrier()
        if rank == 0:
            end.publish(Header(version, stop=version == samples - 1, values={"t0": time.monotonic()}))
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


def memcpy(params: int, samples: int) -> list[float]:
    torch.set_num_threads(1)
    nbytes = sum(p.numel() * 4 for p in make_model(params).parameters())
    src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.uint8)
    out = []
    for _ in range(samples):
        start = time.monotonic()
        dst.copy_(src)
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


def row(scheme: str, params: int, latencies: list[float]) -> dict:
    q = statistics.quantiles(latencies, n=10)
    return {"scheme": scheme, "params": params, "tensors": 100, "median_ms": statistics.median(latencies), "p90_ms": q[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--subscribers", type=int, default=2)
    parser.add_argument("--schemes", nargs="+", default=["gloo_per_param", *SCHEMES])
    args = parser.parse_args()

    rows = []
    for params in args.sizes:
        samples = args.samples if params <= 1_000_000 else max(args.samples // 3, 8)
        rows.append(row("memcpy", params, memcpy(params, samples * 5)[5:]))
        world = 1 + args.subscribers
        for scheme in args.schemes:
            if scheme == "gloo_per_param":
                latencies = gather(run_ranks(per_param_rank, world, params, samples, timeout=600))
            else:
                latencies = gather(run_ranks(scheme_rank, world, scheme, params, samples, timeout=600))
            rows.append(row(scheme, params, latencies))
        for r in rows[-1 - len(args.schemes):]:
            print(f"{r['scheme']:>15} {r['params']:>10,} params  median {r['median_ms']:9.3f} ms  p90 {r['p90_ms']:9.3f} ms", flush=True)

    def median(scheme, params):
        return next(r["median_ms"] for r in rows if r["scheme"] == scheme and r["params"] == params)

    print("\nratios (medians):")
    for params in args.sizes if {"gloo_per_param", *SCHEMES} <= set(args.schemes) else []:
        print(f"  {params:>10,}: gloo_per_param/gloo {median('gloo_per_param', params) / median('gloo', params):6.1f}x   "
              f"shm/memcpy {median('shm', params) / median('memcpy', params):6.2f}x   "
              f"hierarchical/shm {median('hierarchical', params) / median('shm', params):5.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
