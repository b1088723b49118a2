"""Does Gloo's any-source receive survive a dropped link? (issue 54, the 2-node chaos run)

Three Gloo ranks on two network namespaces (:mod:`harness.testing.netns`, root): rank 0 (the
receiver) and rank 1 on the first, rank 2 on the second. Ranks 1 and 2 each send a 4 kB tensor
to rank 0 every 5 ms; rank 0 takes them with ``dist.irecv`` from any source, as the trainer takes
batches in async mode (:meth:`harness.data.channel.BatchReceiver.receive_any`), and prints every
second how many it took from each. After ``--before-s`` the second namespace's end of the veth
goes down for ``--drop-s``, then up. What it answers: does the receiver go on with rank 1 while
rank 2 is cut off (or is its receive left waiting on rank 2), and does rank 2 come back?

    python benchmarks/any_source_drop.py --drop-s 10
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

PORT = 29411


def rank_main(rank: int, head: str, run_s: float) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://{head}:{PORT}", rank=rank, world_size=3,
        timeout=timedelta(seconds=120),
    )  # fmt: skip
    buf, t0 = torch.zeros(1000), time.monotonic()
    if rank == 0:
        counts, second = {1: 0, 2: 0}, 0
        while time.monotonic() - t0 < run_s:
            work = dist.irecv(buf)  # from any source
            assert work is not None
            work.wait(timedelta(seconds=120))
            counts[work._source_rank()] += 1
            if (now := int(time.monotonic() - t0)) > second:
                print(f"t={now:3d} s  from rank 1: {counts[1]:5d}  from rank 2: {counts[2]:5d}")
                second = now
        sys.stdout.flush()
    else:  # past the receiver's end, until its exit closes the connection
        while time.monotonic() - t0 < run_s + 30:
            try:
                dist.send(torch.full((1000,), float(rank)), dst=0)
            except RuntimeError:
                break
            time.sleep(0.005)
    os._exit(0)  # no teardown: the receiver has gone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drop-s", type=float, default=10.0)
    parser.add_argument("--before-s", type=float, default=15.0, help="start to drop (init too)")
    parser.add_argument("--after-s", type=float, default=15.0, help="link up to the end")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # a rank's own process
    parser.add_argument("--head", help=argparse.SUPPRESS)
    parser.add_argument("--run-s", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        return rank_main(args.rank, args.head, args.run_s)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from harness.testing.netns import ip_command, two_nodes

    run_s = args.before_s + args.drop_s + args.after_s
    with two_nodes("s") as (a, b):
        procs = [
            subprocess.Popen(
                node.run(
                    [
                        sys.executable,
                        __file__,
                        f"--rank={r}",
                        f"--head={a.address}",
                        f"--run-s={run_s}",
                    ]
                ),
                env={**os.environ, **node.env(), "OMP_NUM_THREADS": "1"},
            )
            for r, node in ((0, a), (1, a), (2, b))
        ]
        time.sleep(args.before_s)
        link = [ip_command(), "-n", b.namespace, "link", "set", b.interface]
        subprocess.run([*link, "down"], check=True)
        print(f"--- rank 2's link down for {args.drop_s:g} s", flush=True)
        time.sleep(args.drop_s)
        subprocess.run([*link, "up"], check=True)
        print("--- rank 2's link up", flush=True)
        for proc in procs:
            proc.wait(timeout=run_s + 120)


if __name__ == "__main__":
    main()
