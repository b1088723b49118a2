"""What benchmarks/chaos.py finds at the end of its run, and its table."""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import time
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from chaos import Job

SEGMENT = re.compile(r"harness-\d+-p\d+-(\d+)-")


def rows_of(run: Path) -> list[dict[str, str]]:
    try:
        with open(run / "metrics.csv", newline="") as f:
            return list(csv.DictReader(f))
    except (OSError, csv.Error):
        return []


def run_files(run: Path) -> dict[str, bytes]:
    """Every file under the run directory (``.lock`` included) with its bytes."""
    files = {}
    for p in sorted(run.rglob("*")):
        try:
            if p.is_file():
                files[str(p.relative_to(run))] = p.read_bytes()
        except OSError:  # a checkpoint rotated out while we read
            pass
    return files


def row_faults(rows: list[dict[str, str]], every: int) -> dict[str, list[int]]:
    """Rows whose frames are not above the row before (a frame range logged twice), and gaps of
    more than two logging intervals between rows (a range never logged). The last row (the end of
    the run) may come at any frame."""
    frames = [int(r["frames"]) for r in rows[1:]]  # the first row is the start-up's
    duplicated = [b for a, b in pairwise(frames) if b <= a]
    missing = [a for a, b in pairwise(frames) if b - a > 2 * every]
    return {"duplicated": duplicated, "missing_after": missing}


def total(rows: list[dict[str, str]], key: str) -> float:
    return sum(float(r.get(key) or 0) for r in rows)


def checkpoints(run: Path) -> dict[str, str]:
    """Each checkpoint's state.pt loaded as a resume would load it: 'ok' or the error."""
    found = {}
    for state in sorted((run / "checkpoints").glob("step-*/state.pt")):
        try:
            torch.load(state, weights_only=True)
            found[state.parent.name] = "ok"
        except Exception as e:
            found[state.parent.name] = f"{type(e).__name__}: {e}"[:200]
    return found


def left_processes(tag: str) -> list[str]:
    """Processes that carry the job's tag in their environment (the job's and every child's)."""
    left = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and f"CHAOS_TAG={tag}".encode() in (entry / "environ").read_bytes()
            ):
                left.append(f"{entry.name} {(entry / 'comm').read_text().strip()}")
        except OSError:
            continue
    return left


def left_segments(before: set[str]) -> list[str]:
    """Harness segments in /dev/shm that were not there before the run and whose creator is dead
    (another job on the machine may hold live ones of its own)."""
    left = []
    for name in sorted(set(Path("/dev/shm").iterdir()) - {Path("/dev/shm", n) for n in before}):
        found = SEGMENT.match(name.name)
        if found and not Path(f"/proc/{found[1]}").exists():
            left.append(name.name)
    return left


def final_checks(
    job: Job, args: argparse.Namespace, faults: list[dict[str, Any]], shm_before: set[str]
) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while (processes := left_processes(job.tag)) and time.monotonic() < deadline:
        time.sleep(0.5)  # workers and a last joiner end a moment after the launcher
    rows = rows_of(job.run)
    trained = int(rows[-1]["frames"]) if rows else 0
    loads = checkpoints(job.run)
    done = [f for f in faults if "skipped" not in f]
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "seed": args.seed,
        "duration_s": args.duration,
        "exit_status": job.exit_status,
        "frames_asked": args.frames,
        "frames_trained": trained,
        "rows": len(rows),
        "end_line": next((line.strip() for _, line in job.lines if "run finished" in line), None),
        **row_faults(rows, 2048),
        "checkpoints": loads,
        "collector_restarts": total(rows, "collect/collector_restarts"),
        "frames_lost": total(rows, "collect/frames_lost"),
        "env_restarts": total(rows, "collect/env_restarts"),
        "refused_launch_changed": sorted({n for f in faults for n in f.get("changed", [])}),
        "shm_left": left_segments(shm_before),
        "processes_left": processes,
        "faults": faults,
        "not_noticed": [i for i, f in enumerate(done) if not f.get("noticed_s")],
        "not_whole": [i for i, f in enumerate(done) if not f.get("whole_s")],
    }
    report["ok"] = (
        report["exit_status"] == 0
        and trained >= args.frames
        and not report["duplicated"]
        and not report["missing_after"]
        and bool(loads)
        and all(v == "ok" for v in loads.values())
        and not report["refused_launch_changed"]
        and not report["shm_left"]
        and not processes
        and not report["not_noticed"]
        and not report["not_whole"]
    )
    return report


def seconds(value: Any) -> str:
    return "" if value is None else f"{value:.1f}"


def print_table(report: dict[str, Any]) -> None:
    print("\n| # | fault | target | injected (s) | noticed (s) | by | whole again (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for i, f in enumerate(report["faults"]):
        by = f.get("skipped") or f.get("note") or (f.get("noticed_by") or "NOT NOTICED")[:90]
        print(
            f"| {i + 1} | {f['kind']} | {f.get('target', '')} | {seconds(f.get('injected_s'))} | "
            f"{seconds(f.get('noticed_s'))} | `{by}` | {seconds(f.get('whole_s'))} |"
        )
    kinds = sorted({f["kind"] for f in report["faults"]})
    print("\n| fault | count | noticed | median injected to whole again (s) |")
    print("| --- | --- | --- | --- |")
    for kind in kinds:
        mine = [f for f in report["faults"] if f["kind"] == kind and "skipped" not in f]
        waits = [f["whole_s"] - f["injected_s"] for f in mine if f.get("whole_s") is not None]
        median = f"{statistics.median(waits):.2f}" if waits else ""
        noticed = sum(1 for f in mine if f.get("noticed_s") is not None)
        print(f"| {kind} | {len(mine)} | {noticed} | {median} |")
    checks = {
        "exit status": report["exit_status"],
        "frames asked / trained (last row)": (
            f"{report['frames_asked']:,} / {report['frames_trained']:,}"
        ),
        "the run's last word": report["end_line"],
        "collector restarts; frames lost; env restarts (metrics.csv)": (
            f"{report['collector_restarts']:.0f}; {report['frames_lost']:.0f}; "
            f"{report['env_restarts']:.0f}"
        ),
        "frames trained again after trainer kills (logged, then lost)": sum(
            f.get("frames_redone", 0) for f in report["faults"]
        ),
        "metrics.csv rows; duplicated; missing after": (
            f"{report['rows']}; {report['duplicated'] or 'none'}; "
            f"{report['missing_after'] or 'none'}"
        ),
        "checkpoints loaded (weights_only)": ", ".join(
            f"{k}: {v}" for k, v in report["checkpoints"].items()
        ),
        "files changed by refused launches": report["refused_launch_changed"] or "none",
        "shared-memory segments left": report["shm_left"] or "none",
        "processes left": report["processes_left"] or "none",
        "every invariant held": report["ok"],
    }
    print("\n| check | result |\n| --- | --- |")
    for key, value in checks.items():
        print(f"| {key} | {value} |")
