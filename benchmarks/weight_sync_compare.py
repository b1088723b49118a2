"""Before and after: this build's weight sync against another checkout's, in the same run.

    python benchmarks/weight_sync_compare.py --before /tmp/before-sync \\
        [--sizes 10000000] [--schemes gloo shm hierarchical] [--collectors 2] [--repeats 5]

Each launch runs one build's own ``benchmarks/weight_sync.py`` for one scheme and one size, in a
process of its own with ``PYTHONPATH`` set to that build's checkout (it wins over an editable
install). The builds take turns, scheme by scheme, and which one goes first alternates from one
repeat to the next, so that both see the same load on a shared machine. Each build runs with its
own defaults (this one's ``sync.bucket_mb`` and ``sync.verify`` included). A row: each build's
median of its launches' medians, and after / before. Where a build's benchmark measures it, each
launch also says the CPU time a publish took in all its ranks together (user and system, every
thread): on a shared machine a launch's latency swings with the load, its CPU time far less.
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
from pathlib import Path

THIS_BUILD = Path(__file__).resolve().parents[1]


def launch(
    build: Path, scheme: str, params: int, args: argparse.Namespace, out: Path
) -> tuple[float, float | None]:
    """One run of ``build``'s benchmark: the median latency of ``scheme``, ms, and the CPU time a
    publish took in all its ranks together, ms (None where that build's benchmark does not say)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(build))
    command = [sys.executable, str(build / "benchmarks" / "weight_sync.py")]
    command += ["--sizes", str(params), "--schemes", scheme, "--json", str(out)]
    command += ["--subscribers", str(args.collectors), "--samples", str(args.samples)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} (PYTHONPATH={build}) failed:\n{done.stderr}")
    row = next(r for r in json.loads(out.read_text()) if r["scheme"] == scheme)
    cpu = None
    if "trainer_cpu_ms" in row:
        cpu = row["trainer_cpu_ms"] + args.collectors * row["collector_cpu_ms"]
    return row["median_ms"], cpu


def compare(params: int, args: argparse.Namespace, scratch: Path) -> list[dict]:
    builds = {"before": Path(args.before).resolve(), "after": THIS_BUILD}
    medians: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float | None]] = {}
    for repeat in range(args.repeats):
        order = ["before", "after"] if repeat % 2 == 0 else ["after", "before"]
        for scheme in args.schemes:
            for name in order:
                ms, cpu = launch(builds[name], scheme, params, args, scratch / f"{name}.json")
                medians.setdefault((scheme, name), []).append(ms)
                cpus.setdefault((scheme, name), []).append(cpu)
                said = "" if cpu is None else f", CPU {cpu:6.1f} ms a publish (all ranks)"
                load = os.getloadavg()[0]
                print(
                    f"  {params:>11,} {scheme:>12} {name:>6}: {ms:8.3f} ms{said}, load {load:.1f}"
                )
    rows = []
    for scheme in args.schemes:
        before, after = medians[(scheme, "before")], medians[(scheme, "after")]
        rows.append(
            {
                "scheme": scheme,
                "params": params,
                "collectors": args.collectors,
                "before_ms": statistics.median(before),
                "after_ms": statistics.median(after),
                "after_over_before": statistics.median(after) / statistics.median(before),
                "before_launches_ms": before,
                "after_launches_ms": after,
                "before_cpu_ms": cpus[(scheme, "before")],
                "after_cpu_ms": cpus[(scheme, "after")],
            }
        )
    return rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", required=True, help="the other build's checkout")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000_000])
    parser.add_argument("--schemes", nargs="+", default=["gloo", "shm", "hierarchical"])
    parser.add_argument("--collectors", type=int, default=2)
    parser.add_argument("--samples", type=int, default=40, help="passed to both benchmarks")
    parser.add_argument("--repeats", type=int, default=5, help="launches of each build and scheme")
    parser.add_argument("--json", help="write the rows here")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}: {vars(args)}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for params in args.sizes:
            rows += compare(params, args, Path(scratch))
    for r in rows:
        print(
            f"{r['scheme']:>12} {r['params']:>11,} params, {r['collectors']} collectors: "
            f"before {r['before_ms']:8.3f} ms  after {r['after_ms']:8.3f} ms  "
            f"after/before {r['after_over_before']:.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
