"""GPU checks of the weight sync schemes; run by scripts/gpu_check.sh.

1. sync=gloo with the trainer's model on the GPU and collectors on the CPU
   (pinned CPU staging): weights arrive bit-exact.
2. sync=nccl between ranks on distinct GPUs (needs 2+ GPUs; NCCL refuses two
   ranks on one device): weights arrive bit-exact on every collector's GPU.
Exits 0 with a message when there is no GPU.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from harness.distributed.setup import init_distributed
from harness.distributed.spawn import run_ranks
from harness.distributed.topology import Layout
from harness.sync import Header, make_publisher, make_subscriber
from harness.sync.config import SyncConfig


def check(rank: int, world: int, scheme: str, trainer_device: str) -> bool:
    nccl = scheme == "nccl"
    if nccl:
        torch.cuda.set_device(rank)
    groups = init_distributed(Layout.from_env(1), 60, nccl_sync=nccl)
    device = f"cuda:{rank}" if nccl else (trainer_device if rank == 0 else "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 8)).to(device)
    cfg = SyncConfig(name=scheme, timeout_s=60)
    end = make_publisher(cfg, rank, groups) if rank == 0 else make_subscriber(cfg, rank, groups)
    end.connect({"policy": model})
    ok = True
    for version in range(5):
        if rank == 0:
            with torch.no_grad():
                for p in model.parameters():
                    p.fill_(version + 0.25)
            end.publish(Header(version, stop=version == 4))
        else:
            end.wait(version)
            ok &= all(bool((p == version + 0.25).all()) for p in model.parameters())
            ok &= all(p.device.type == ("cuda" if nccl else "cpu") for p in model.parameters())
    end.close()
    return ok


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing to check (these checks need a GPU machine)")
        return 0
    failures = 0
    results = run_ranks(check, 3, "gloo", "cuda:0", timeout=300)
    good = all(s == "ok" and v in (True, None) for s, v in results.values())
    print(f"gloo, GPU trainer -> CPU collectors (pinned staging): {'ok' if good else results}")
    failures += not good
    gpus = torch.cuda.device_count()
    if gpus < 2:
        print(f"nccl: skipped, {gpus} GPU here and NCCL needs one GPU per rank (2+)")
    else:
        world = min(gpus, 3)
        results = run_ranks(check, world, "nccl", "cuda:0", timeout=300)
        good = all(s == "ok" and v in (True, None) for s, v in results.values())
        print(f"nccl, {world} ranks on {world} GPUs: {'ok' if good else results}")
        failures += not good
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
