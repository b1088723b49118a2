"""The GPU check's steps, each a bounded command whose outcome is a row of the table."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]  # the checkout: tests/ and benchmarks/ run from there
# Timed in this order: the costliest compile last.
ALGOS = ["sac", "td3", "dqn", "ppo", "iql", "cql"]
# Seconds each step may take on the GPU machine (compile times included: ppo_atari's warm-up
# compiles its update, and its timed run loads the kernels from the cache the warm-up filled). On
# one GPU (no nccl step) they add up to 45 + 3 x 25 + 35 + 60 + 35 + 120 + 45 + 55 = 470 s, under
# the 8 minutes a lease's call is planned for; with the install and Python's start-ups, one 600 s
# call. They are estimates until a GPU machine measures them.
BUDGET_S = {
    "tests": 45,
    "ppo_cartpole": 25,
    "sac_pendulum": 35,
    "warm_up": 60,
    "ppo_atari": 35,
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
# ppo_cartpole runs with every scheme one node has; the others with gloo (SAC's rows measure the
# update, which the scheme does not change)
SCHEMES = {"ppo_atari": ("gloo",), "sac_pendulum": ("gloo",)}
# Presets whose update is compiled (algo.compile=true), and the frames of their untimed warm-up
# launch (on the GPU machine, in a dry run): two rounds of the timed run's batches.
COMPILED = {"ppo_atari": (2048, 1024)}


class Check:
    """Runs the steps, each bounded, and keeps one row per check."""

    def __init__(self, work: Path, dry_run: bool):
        self.work, self.dry_run = work, dry_run
        self.device = "cpu" if dry_run else "cuda"
        self.scale = DRY_RUN_SLOWER if dry_run else 1
        self.rows: list[dict] = []
        self.step = ""  # the step the next launch() belongs to
        self.written: Callable[[Check], object] | None = None  # writes the table so far
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
        # A session of its own: past its budget the whole of it goes (torchrun's ranks too), not
        # the launcher alone.
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
        row = {"step": step, "check": check, "status": status, "seconds": round(seconds, 1)}
        self.rows.append({**row, "result": result, **data})
        print(f"[gpu_check] {step} {check}: {status}, {seconds:.0f} s: {result}", flush=True)
        if self.written is not None:
            # After every row: a step that overruns or a machine taken back keeps the others.
            self.written(self)


def tests(c: Check) -> None:
    # The gpu tier of tests/devices: test_gpu.py and test_gpu_path_on_cuda.py.
    cmd = [sys.executable, "-m", "pytest", "tests/devices", "-m", "gpu"]
    status, seconds, out = c.run(
        "tests", [*cmd, "-q", "-p", "no:cacheprovider", "-rs"], BUDGET_S["tests"]
    )
    summary = [
        line.strip("= ")
        for line in out.splitlines()
        if re.search(r"\d+ (passed|skipped|failed|errors?)\b", line)
    ]
    result = summary[-1] if summary else out.strip()[-200:]
    c.add("0", "GPU test tier (pytest tests/devices -m gpu)", status, seconds, result)


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
    # Where the trainer's tensors are, as its device check read them after the first update (not
    # the layout line, which says what placement chose); and where each rank was placed, beside it.
    found = re.findall(r"device check after the first update: rank 0 trainer: (.+)", out)
    placed = re.findall(r"rank \d+ (?:trainer|collector): (cuda:\d+|cpu)", out)
    # What a GPU trainer's float32 products run as, as its layout line says (trainer.fast_cuda).
    kernels = re.findall(r"rank 0 trainer: cuda:\d+ \(([^)]*)\)", out)
    data: dict = {"trainer_tensors": found[0] if found else None, "placed": placed}
    data["trainer_kernels"] = kernels[0].split(";")[0] if kernels else None
    tensors = found[0] if found else "no device check ran"
    result = f"trainer's tensors: {tensors}; placed " + " + ".join(placed)
    result += f" ({data['trainer_kernels']})" if kernels else ""
    metrics = run_dir / "metrics.csv"
    if metrics.exists():
        data.update(run_figures(list(csv.DictReader(metrics.open()))))
        result += (
            f"; {data['frames']:,} frames, {data['frames_per_s']:,.0f} frames/s, last publish "
            f"{data['sync_ms']:.2f} ms, "
        )
        returned = data["episode_return"]
        result += f"return {returned:.1f}" if returned is not None else "no episode ended"
    expected = "cpu" if c.dry_run else "cuda"
    if status == "ok" and not (
        found and re.fullmatch(rf"\d+ tensors on {expected}(:\d+)?", found[0])
    ):
        status = (
            f"failed (the trainer's tensors: {found[:1] or 'not checked'}; "
            f"expected all on {expected})"
        )
    c.add(c.step, name, status, seconds, result, **data)


def run_figures(rows: list[dict]) -> dict:
    """Frames, frames/s, the last publish's ms and the last training return of a run's rows."""
    returns = [
        float(r["train/episode_return"])
        for r in rows
        if r.get("train/episode_return") not in (None, "", "nan")
    ]
    last = rows[-1]
    return {
        "frames": int(float(last["frames"])),
        "frames_per_s": float(last.get("collect/frames_per_s") or 0),
        "sync_ms": float(last.get("sync/ms") or 0),
        "episode_return": returns[-1] if returns else None,
    }


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
            if preset in COMPILED and scheme == SCHEMES[preset][0]:
                warm_up(c, preset, overrides)
            launch(c, f"{preset}-{scheme}", preset, overrides, 3, BUDGET_S[preset])


def warm_up(c: Check, preset: str, overrides: list[str]) -> None:
    """A compiled preset's update compiled once before its timed rows: the same launch (the same
    batch shapes), a few rounds long, whose compile fills Inductor's and Triton's caches
    (/tmp/torchinductor_<user>); the timed run then loads its kernels from them instead of
    compiling in its own budget."""
    frames = COMPILED[preset][1 if c.dry_run else 0]
    kept = [o for o in overrides if not o.startswith(("collector.total_frames=", "logger."))]
    short = [*kept, f"collector.total_frames={frames}", f"logger.log_every_frames={frames}"]
    launch(c, f"{preset}-compile-warm-up", preset, short, 3, BUDGET_S["warm_up"])


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
    overrides = ["sync=nccl", "collector.device=cuda", *RUNS["ppo_cartpole"][0]]
    launch(c, "ppo_cartpole-nccl", "ppo_cartpole", overrides, min(gpus, 3), BUDGET_S["nccl"])


def update(c: Check) -> None:
    """benchmarks/update.py on the device (eager, compiled, amp) and on the CPU, as two commands."""
    repeats = ["--repeats", "3" if c.dry_run else "20"]
    algos = ["dqn", "ppo"] if c.dry_run else ALGOS  # a dry run proves the command on the cheapest
    figures: dict[str, dict] = {}
    for name, device, extra, budget in (
        ("update-device", c.device, ["--compile", "--amp"], BUDGET_S["update_gpu"]),
        ("update-cpu", "cpu", [], BUDGET_S["update_cpu"]),
    ):
        out = c.work / f"{name}.json"
        cmd = [sys.executable, "benchmarks/update.py", "--device", device, *repeats]
        cmd += ["--only", *algos, *extra, "--json", str(out)]
        status, seconds, _ = c.run(name, cmd, budget)
        rows = json.loads(out.read_text()) if out.exists() else []
        figures[name] = {r["case"]: r for r in rows}
        check = f"benchmarks/update.py --device {device} {' '.join(extra)}".strip()
        c.add("3", check, status, seconds, f"{len(rows)} rows")
    for algo in algos:
        update_row(c, algo, figures["update-device"], figures["update-cpu"])


def update_row(c: Check, algo: str, device_rows: dict, cpu_rows: dict) -> None:
    """One algorithm's update on the device (eager, compiled, amp) beside the CPU's."""
    eager, cpu = device_rows.get(f"update/{algo}"), cpu_rows.get(f"update/{algo}")
    compiled = device_rows.get(f"update/{algo}/compiled")
    amp = device_rows.get(f"update/{algo}/amp")
    if eager is None:
        c.add(
            "3",
            f"update {algo}",
            "not reached",
            0.0,
            "the benchmark ran out of budget before this case",
        )
        return
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
            f"compiled {compiled['ms']:.3f} ms ({eager['ms'] / compiled['ms']:.2f}x, "
            f"first call {compiled['compile_s']:.0f} s)"
        )
    if amp:
        parts.append(f"amp=bf16 {amp['ms']:.3f} ms ({eager['ms'] / amp['ms']:.2f}x)")
    c.add("3", f"update {algo}", "ok", 0.0, "; ".join(parts), **data)


def weight_sync(c: Check) -> None:
    size = "1000000" if c.dry_run else "10000000"
    out = c.work / "weight_sync.json"
    cmd = [sys.executable, "benchmarks/weight_sync.py", "--publisher-device", c.device]
    cmd += ["--sizes", size, "--samples", "24", "--schemes", "d2h", "shm", "gloo", "hierarchical"]
    status, seconds, _ = c.run("weight_sync", [*cmd, "--json", str(out)], BUDGET_S["weight_sync"])
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


STEPS = (tests, runs, nccl, update, weight_sync)
