"""The GPU check, run by scripts/gpu_check.sh: the harness on a GPU as its users run it.

    scripts/gpu_check.sh [--out DIR] [--dry-run]

1. ``harness.train`` through torchrun, the trainer on CUDA and 2 CPU collectors:
   PPO CartPole and SAC Pendulum, short budgets, ``sync=gloo``, ``shm``, ``hierarchical``; PPO on
   Atari Breakout (the Nature CNN), ``sync=gloo``;
2. ``sync=nccl`` with GPU collectors when the machine has a GPU per rank (else skipped, saying so);
3. ``benchmarks/update.py`` on CUDA (eager, compiled, amp) for every algorithm, the CPU's beside it;
4. ``benchmarks/weight_sync.py`` with a CUDA publisher: a 10M-parameter policy to CPU collectors
   against a plain device-to-host copy of the same bytes;
0. first, the GPU test tier (tests/devices/test_gpu.py).

Prints one table, writes ``gpu_check.json``, ``gpu_check.md`` and ``logs.tar.gz`` (every
step's output and the runs' metrics) into ``--out``. Each step has a time budget; together
they fit in 8 minutes on one H200 with 16 cores. ``--dry-run`` runs every step on the CPU
(trainer.device=cpu, --device cpu, smaller budgets), to prove the script on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
ALGOS = [
    "sac",
    "td3",
    "dqn",
    "ppo",
    "iql",
    "cql",
]  # timed in this order: the costliest compile last
# Seconds each step may take on the GPU machine (compile times included: ppo_atari compiles its
# update). On one GPU (no nccl step) they add up to 60 + 3 x 25 + 3 x 35 + 75 + 120 + 45 + 55 = 535
# s, 9 minutes.
BUDGET_S = {
    "tests": 60,
    "ppo_cartpole": 25,
    "sac_pendulum": 35,
    "ppo_atari": 75,
    "nccl": 45,
    "update_gpu": 120,
    "update_cpu": 45,
    "weight_sync": 55,
}
DRY_RUN_SLOWER = (
    8  # a dry run's budgets: this project's shared 2-core machines are that much slower
)
RUNS = {  # what a run trains, on the GPU machine and in a dry run (shorter)
    "ppo_cartpole": (
        ["collector.total_frames=20480", "logger.log_every_frames=5120"],
        ["collector.total_frames=2048", "logger.log_every_frames=1024"],
    ),
    "sac_pendulum": (
        [
            "collector.total_frames=3000",
            "algo.learning_starts=1000",
            "logger.log_every_frames=1000",
        ],
        [
            "collector.total_frames=768",
            "algo.learning_starts=512",
            "algo.batch_size=32",
            "logger.log_every_frames=256",
        ],
    ),
    "ppo_atari": (  # a CNN: where a GPU trainer matters most (CPU collectors step Breakout)
        ["collector.total_frames=8192", "logger.log_every_frames=4096"],
        [
            "collector.total_frames=1024",
            "collector.num_envs=2",
            "collector.frames_per_batch=256",
            "logger.log_every_frames=512",
        ],
    ),
}
SCHEMES = {"ppo_atari": ("gloo",)}  # the others run with every scheme one node has


class Check:
    """Runs the steps, each bounded, and keeps one row per check."""

    def __init__(self, work: Path, dry_run: bool):
        self.work, self.dry_run = work, dry_run
        self.device = "cpu" if dry_run else "cuda"
        self.scale = DRY_RUN_SLOWER if dry_run else 1
        self.rows: list[dict] = []
        self.step = ""  # the step the next launch() belongs to
        self.written: Callable[[Check], object] | None = None  # writes the table so far (main's)
        (work / "logs").mkdir(parents=True, exist_ok=True)

    def run(
        self, name: str, cmd: list[str], budget_s: float, cwd: Path = ROOT
    ) -> tuple[str, float, str]:
        """``cmd`` to its end or its budget; (status, seconds, output). The output goes to
        logs/<name>.log."""
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        start, limit = time.monotonic(), budget_s * self.scale
        print(f"[gpu_check] {name}: {' '.join(cmd)} (budget {limit:.0f} s)", flush=True)
        # A session of its own: past its budget the whole of it goes (torchrun's ranks too), not the
        # launcher alone.
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=limit)
            status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            status = f"over budget ({limit:.0f} s)"
        (self.work / "logs" / f"{name}.log").write_text(output)
        return status, time.monotonic() - start, output

    def add(self, step: str, check: str, status: str, seconds: float, result: str, **data) -> None:
        self.rows.append(
            {
                "step": step,
                "check": check,
                "status": status,
                "seconds": round(seconds, 1),
                "result": result,
                **data,
            }
        )
        print(f"[gpu_check] {step} {check}: {status}, {seconds:.0f} s: {result}", flush=True)
        if self.written is not None:
            self.written(
                self
            )  # after every row: a step that overruns or a machine taken back keeps the others


def tests(c: Check) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/devices/test_gpu.py",
        "-q",
        "-p",
        "no:cacheprovider",
        "-rs",
    ]
    status, seconds, out = c.run("tests", cmd, BUDGET_S["tests"])
    summary = [
        line.strip("= ")
        for line in out.splitlines()
        if re.search(r"\d+ (passed|skipped|failed|errors?)\b", line)
    ]
    c.add(
        "0",
        "GPU test tier (tests/devices/test_gpu.py)",
        status,
        seconds,
        summary[-1] if summary else out.strip()[-200:],
    )


def launch(
    c: Check, name: str, preset: str, overrides: list[str], nproc: int, budget_s: float
) -> None:
    """One real torchrun launch of harness.train; its metrics and every rank's device."""
    run_dir = c.work / "runs" / name
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "harness.train",
        f"experiment={preset}",
        f"run_dir={run_dir}",
        "logger.console=false",
        "eval.every_frames=0",
        *overrides,
    ]
    status, seconds, out = c.run(name, cmd, budget_s, cwd=c.work)
    # Where the trainer's tensors are, as its device check read them after the first update (not the
    # layout line, which says what placement chose); and where each rank was placed, beside it.
    found = re.findall(r"device check after the first update: rank 0 trainer: (.+)", out)
    placed = re.findall(r"rank \d+ (?:trainer|collector): (cuda:\d+|cpu)", out)
    data: dict = {"trainer_tensors": found[0] if found else None, "placed": placed}
    result = (
        f"trainer's tensors: {found[0] if found else 'no device check ran'}; placed "
        + " + ".join(placed)
    )
    metrics = run_dir / "metrics.csv"
    if metrics.exists():
        rows = list(csv.DictReader(metrics.open()))
        returns = [
            float(r["train/episode_return"])
            for r in rows
            if r.get("train/episode_return") not in (None, "", "nan")
        ]
        last = rows[-1]
        data.update(
            frames=int(float(last["frames"])),
            frames_per_s=float(last.get("collect/frames_per_s") or 0),
            sync_ms=float(last.get("sync/ms") or 0),
            episode_return=returns[-1] if returns else None,
        )
        result += f"; {data['frames']:,} frames, {data['frames_per_s']:,.0f} frames/s, last publish {data['sync_ms']:.2f} ms, "
        result += f"return {returns[-1]:.1f}" if returns else "no episode ended"
    expected = "cpu" if c.dry_run else "cuda"
    if status == "ok" and not (
        found and re.fullmatch(rf"\d+ tensors on {expected}(:\d+)?", found[0])
    ):
        status = f"failed (the trainer's tensors: {found[:1] or 'not checked'}; expected all on {expected})"
    c.add(c.step, name, status, seconds, result, **data)


def runs(c: Check) -> None:
    c.step = "1"
    for preset, (real, dry) in RUNS.items():
        for scheme in SCHEMES.get(preset, ("gloo", "shm", "hierarchical")):
            overrides = [
                f"sync={scheme}",
                f"trainer.device={c.device}",
                "collector.device=cpu",
                *(dry if c.dry_run else real),
            ]
            launch(c, f"{preset}-{scheme}", preset, overrides, 3, BUDGET_S[preset])


def nccl(c: Check) -> None:
    c.step = "2"
    gpus = torch.cuda.device_count()
    if c.dry_run or gpus < 2:
        c.add(
            "2",
            "ppo_cartpole-nccl",
            "skipped",
            0.0,
            f"{gpus} GPU{'s' * (gpus != 1)} here: sync=nccl needs one GPU per rank "
            "(a trainer and at least one collector: 2+ GPUs)",
        )
        return
    launch(
        c,
        "ppo_cartpole-nccl",
        "ppo_cartpole",
        ["sync=nccl", "collector.device=cuda", *RUNS["ppo_cartpole"][0]],
        min(gpus, 3),
        BUDGET_S["nccl"],
    )


def update(c: Check) -> None:
    """benchmarks/update.py on the device (eager, compiled, amp) and on the CPU, as two commands."""
    repeats = ["--repeats", "3" if c.dry_run else "20"]
    only = [
        "--only",
        *(["dqn", "ppo"] if c.dry_run else ALGOS),
    ]  # a dry run proves the command on the two cheapest
    figures: dict[str, dict] = {}
    for name, device, extra, budget in (
        ("update-device", c.device, ["--compile", "--amp"], BUDGET_S["update_gpu"]),
        ("update-cpu", "cpu", [], BUDGET_S["update_cpu"]),
    ):
        out = c.work / f"{name}.json"
        cmd = [
            sys.executable,
            "benchmarks/update.py",
            "--device",
            device,
            *repeats,
            *only,
            *extra,
            "--json",
            str(out),
        ]
        status, seconds, _ = c.run(name, cmd, budget)
        rows = json.loads(out.read_text()) if out.exists() else []
        figures[name] = {r["case"]: r for r in rows}
        c.add(
            "3",
            f"benchmarks/update.py --device {device} {' '.join(extra)}".strip(),
            status,
            seconds,
            f"{len(rows)} rows",
        )
    device_rows, cpu_rows = figures["update-device"], figures["update-cpu"]
    for algo in only[1:]:
        eager, cpu = device_rows.get(f"update/{algo}"), cpu_rows.get(f"update/{algo}")
        compiled, amp = (
            device_rows.get(f"update/{algo}/compiled"),
            device_rows.get(f"update/{algo}/amp"),
        )
        if eager is None:
            c.add(
                "3",
                f"update {algo}",
                "not reached",
                0.0,
                "the benchmark ran out of budget before this case",
            )
            continue
        data = {
            "device_ms": eager["ms"],
            "cpu_ms": cpu and cpu["ms"],
            "compiled_ms": compiled and compiled["ms"],
            "compile_s": compiled and compiled["compile_s"],
            "amp_ms": amp and amp["ms"],
            "devices": eager.get("devices"),
        }
        parts = [f"{c.device} {eager['ms']:.3f} ms ({eager.get('devices', 'no device check')})"]
        if cpu:
            parts.append(f"cpu {cpu['ms']:.2f} ms (cpu/{c.device} {cpu['ms'] / eager['ms']:.1f}x)")
        if compiled:
            parts.append(
                f"compiled {compiled['ms']:.3f} ms ({eager['ms'] / compiled['ms']:.2f}x, first call {compiled['compile_s']:.0f} s)"
            )
        if amp:
            parts.append(f"amp=bf16 {amp['ms']:.3f} ms ({eager['ms'] / amp['ms']:.2f}x)")
        c.add("3", f"update {algo}", "ok", 0.0, "; ".join(parts), **data)


def weight_sync(c: Check) -> None:
    size = "1000000" if c.dry_run else "10000000"
    out = c.work / "weight_sync.json"
    cmd = [
        sys.executable,
        "benchmarks/weight_sync.py",
        "--publisher-device",
        c.device,
        "--sizes",
        size,
        "--samples",
        "24",
        "--schemes",
        "d2h",
        "shm",
        "gloo",
        "hierarchical",
        "--json",
        str(out),
    ]
    status, seconds, _ = c.run("weight_sync", cmd, BUDGET_S["weight_sync"])
    rows = {r["scheme"]: r for r in json.loads(out.read_text())} if out.exists() else {}
    d2h = rows.get("d2h")
    parts = [
        f"{s} {r['median_ms']:.2f} ms"
        + (f" ({r['median_ms'] / d2h['median_ms']:.2f}x d2h)" if d2h and s != "d2h" else "")
        for s, r in rows.items()
        if s != "memcpy"
    ]
    c.add(
        "4",
        f"weight sync, {int(size):,} params, {c.device} publisher -> 2 CPU collectors",
        status,
        seconds,
        "; ".join(parts) or "no rows",
        medians_ms={s: r["median_ms"] for s, r in rows.items()},
    )


def targets(c: Check) -> list[str]:
    """The issue's targets, read from the rows (docs/gpu.md)."""
    found = []
    sac = next((r for r in c.rows if r["check"] == "update sac"), {})
    if sac.get("cpu_ms") and sac.get("device_ms"):
        found.append(
            f"SAC update, cpu/{c.device}: {sac['cpu_ms'] / sac['device_ms']:.1f}x (target >= 5x)"
        )
    for r in c.rows:
        if r["check"].startswith("update ") and r.get("compiled_ms"):
            found.append(
                f"{r['check'][7:]} compiled vs eager on {c.device}: {r['device_ms'] / r['compiled_ms']:.2f}x (target >= 1.5x)"
            )
    sync = next((r for r in c.rows if r["check"].startswith("weight sync")), {}).get(
        "medians_ms", {}
    )
    for scheme in ("shm", "gloo", "hierarchical"):
        if scheme in sync and "d2h" in sync:
            found.append(
                f"publish by {scheme} / plain device-to-host copy: {sync[scheme] / sync['d2h']:.2f}x (target <= 2x)"
            )
    return found


def table(c: Check, machine: dict, header: str) -> str:
    lines = [
        header,
        "",
        f"Machine: {machine['gpu']}; torch {machine['torch']} (CUDA {machine['cuda']}); {machine['cpus']} CPUs.",
        "",
        "| step | check | status | s | result |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['step']} | {r['check']} | {r['status']} | {r['seconds']:.0f} | {r['result']} |"
        for r in c.rows
    ]
    found = targets(c)
    if found:
        lines += ["", "Targets:", "", *[f"- {t}" for t in found]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", default=str(ROOT / "runs" / f"gpu_check-{time.strftime('%Y%m%d-%H%M%S')}")
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="every step on the CPU, to prove the script without a GPU",
    )
    args = parser.parse_args()
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here (torch.cuda.is_available() is False). Skipped: 0 the GPU test tier, "
            "1 the torchrun runs with a CUDA trainer, 2 sync=nccl, 3 the CUDA update benchmark, 4 the CUDA weight sync "
            "benchmark. scripts/gpu_check.sh --dry-run runs every step on the CPU instead."
        )
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    machine = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (dry run)",
        "gpus": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
        "dry_run": args.dry_run,
    }
    kind = "dry run on the CPU" if args.dry_run else "GPU check"

    def write(c: Check, final: bool = False) -> str:
        """The table and its JSON as they stand (after every row, and once at the end)."""
        total = time.monotonic() - started
        so_far = "in all" if final else "so far (still running)"
        header = f"scripts/gpu_check.sh{' --dry-run' if args.dry_run else ''}: {kind}, {machine['date']}, {total:.0f} s {so_far}"
        text = table(c, machine, header)
        (out / "gpu_check.md").write_text(text)
        (out / "gpu_check.json").write_text(
            json.dumps(
                {
                    "machine": machine,
                    "seconds": total,
                    "final": final,
                    "rows": c.rows,
                    "targets": targets(c),
                },
                indent=1,
            )
        )
        return text

    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        c = Check(Path(tmp), args.dry_run)
        c.written = write
        for step in (tests, runs, nccl, update, weight_sync):
            try:
                step(c)
            except (
                Exception
            ) as e:  # a broken step is a row of the table, and the other steps still run
                (c.work / "logs" / f"{step.__name__}-error.log").write_text(traceback.format_exc())
                c.add("-", step.__name__, f"error ({type(e).__name__})", 0.0, str(e)[:300])
        print("\n" + write(c, final=True))
        with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
            tar.add(
                tmp,
                arcname="gpu_check",
                filter=lambda info: None if "/checkpoints" in info.name else info,
            )
    failed = [r for r in c.rows if r["status"] not in ("ok", "skipped")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
