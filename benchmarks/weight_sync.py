"""Publish-to-applied latency of every weight sync scheme that runs here.

    python benchmarks/weight_sync.py --json bench-weight_sync.json [--sizes 100000 1000000 10000000]
    python benchmarks/weight_sync.py --publisher-device cuda --sizes 10000000 --schemes d2h gloo shm hierarchical

Real spawned ranks: one publisher (rank 0) and two subscribers. Each sample:
rank 0 stamps the clock, publishes, and every subscriber notes when the update
is applied to its policy; a barrier separates samples, so nothing queues. The
clock is CLOCK_MONOTONIC, shared by all processes of a machine.

References measured in the same run: ``memcpy`` (one in-process copy of the
same bytes: the physical limit) and ``gloo_per_param`` (one Gloo broadcast per
tensor: the naive way, close to TorchRL's distributed weight updater).
Models hold about ``params`` float32 parameters as 100 tensors (50 linear layers).

``--publisher-device cuda``: rank 0's model lives on its GPU (a GPU trainer
with CPU collectors: each publish is one device-to-host copy into pinned
memory, then the scheme's transport); the reference ``d2h`` is a plain
device-to-host copy of the same bytes into pinned memory, in one process.
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


def scheme_rank(rank: int, world: int, scheme: str, params: int, samples: int, device: str = "cpu") -> list[float]:
    torch.set_num_threads(1)
    groups = init_distributed(Layout.from_env(1), 60)
    model = make_model(params)
    if rank == 0:
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device).index or 0)
        pack_parameters_(model.to(device))  # as the algorithms do with what they publish, on the trainer's device
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


def memcpy(params: int, samples: int, source: str = "cpu") -> list[float]:
    """One copy of the model's bytes into CPU memory (pinned when ``source`` is a GPU: the ``d2h`` reference)."""
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


def row(scheme: str, params: int, latencies: list[float]) -> dict:
    q = statistics.quantiles(latencies, n=10)
    return {"scheme": scheme, "params": params, "tensors": 100, "median_ms": statistics.median(latencies), "p90_ms": q[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--subscribers", type=int, default=2)
    parser.add_argument("--schemes", nargs="+", default=["gloo_per_param", *SCHEMES],
                        help="gloo_per_param, gloo, shm, hierarchical; d2h: the plain device-to-host copy (with a GPU publisher)")
    parser.add_argument("--publisher-device", default="cpu", help="where rank 0's model lives: cpu, or cuda (a GPU trainer)")
    args = parser.parse_args()

    rows = []
    for params in args.sizes:
        samples = args.samples if params <= 1_000_000 else max(args.samples // 3, 8)
        rows.append(row("memcpy", params, memcpy(params, samples * 5)[5:]))
        world = 1 + args.subscribers
        for scheme in args.schemes:
            if scheme == "gloo_per_param":
                latencies = gather(run_ranks(per_param_rank, world, params, samples, timeout=600))
            elif scheme == "d2h":
                latencies = memcpy(params, samples * 5, args.publisher_device)[5:]
            else:
                latencies = gather(run_ranks(scheme_rank, world, scheme, params, samples, args.publisher_device, timeout=600))
            rows.append({**row(scheme, params, latencies), "publisher": args.publisher_device})
        for r in rows[-1 - len(args.schemes):]:
            print(f"{r['scheme']:>15} {r['params']:>10,} params  median {r['median_ms']:9.3f} ms  p90 {r['p90_ms']:9.3f} ms", flush=True)

    def median(scheme, params):
        return next(r["median_ms"] for r in rows if r["scheme"] == scheme and r["params"] == params)

    if "d2h" in args.schemes:
        for params in args.sizes:
            print(f"  {params:>10,}: " + "   ".join(f"{s}/d2h {median(s, params) / median('d2h', params):5.2f}x"
                                                  for s in args.schemes if s != "d2h"))
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
