"""A chaos run (issue 54): one real job, faults injected from a seed.

The job: PPO on ``chaos_env:ChaosCartPole-v0`` (CartPole that breaks when told), 1 trainer + 4
supervised collectors (``collector.max_restarts``, ``collector.watchdog_s``) by default, under
torchrun ``--max-restarts`` through ``python -m harness.cli.launch``, a checkpoint every
``--checkpoint-every`` frames, a join port, ``dist_late_s`` and ``sync.late_s`` at ``--late-s``.
Its layout: ``--mode async|sync`` (collector.mode), ``--scheme gloo|shm|hierarchical`` (sync=),
``--trainers 1|2`` (topology.trainers), ``--nodes 1|2`` (two network namespaces, one torchrun
agent each, benchmarks/chaos_nodes.py; not with shm, which reaches trainer 0's node only; 3
ranks a node). From its first row on, for ``--duration`` seconds, a schedule drawn from
``--seed`` injects one fault at a time, at random times, each after the job was whole again from
the one before (or a minute passed), or with ``--overlap`` each at its time, whatever the others
are doing. With ``--by-frames`` a fault planned ``t`` seconds in comes once the job logged
``0.6 * --frames * t / --duration`` frames instead: on a loaded machine the schedule slows down
with the job, and ends before it (tests/durability/test_chaos.py). The kinds (``--kinds``; all
but ``worker_stop`` by default, so that a seed draws the schedule it drew in the runs of
docs/runs_that_last.md):

- ``worker_kill``: SIGKILL of a collector's worker (its env-stepping process);
- ``worker_hang``: SIGSTOP of a worker for ``--hang-s`` (past ``collector.watchdog_s``), then
  SIGCONT;
- ``worker_stop``: SIGSTOP of a worker caught waiting on its rank (between batches, where no env
  step is due) for ``--hang-s``, then SIGCONT: its pulse goes quiet, and its rank names it and
  replaces it when it next asks for a batch, within ``collector.watchdog_s``;
- ``env_raise``, ``env_nan``: an env step that raises, or returns a NaN observation;
- ``trainer_kill``, ``collector_rank_kill``: SIGKILL of rank 0, or of a collector's rank (not its
  worker): torchrun restarts the group, which resumes from the newest checkpoint;
- ``collector_rank_stop``: SIGSTOP of a collector's rank (not its worker) for ``--hang-s``, then
  SIGCONT: a trainer names it after ``--late-s`` (the weights' broadcast waiting for it, or its
  batch), and says when the wait ended;
- ``disk_full``: the run directory's filesystem (a tmpfs of ``--disk-mb``, or the ext4 disk of
  ``slow_disk``, mounted for the run: needs root) filled to a few kB, so that the next checkpoint
  cannot be written; the job names it and exits, the filler goes, and torchrun's restart resumes
  from the newest kept checkpoint;
- ``slow_disk``: the run directory's disk (ext4 on a loop device, benchmarks/chaos_disk.py)
  throttled to ``--slow-bps`` bytes a second until the next checkpoint is written, whose line
  says how long it took;
- ``refused_launch``: a second launch on the same run directory, refused while the job runs;
  the run's files are compared by hash before and after (the running job may only append to
  ``metrics.csv`` and add or rotate checkpoints);
- ``joiner_kill``: ``harness join`` to the job's port, SIGKILLed once it joined (async mode, one
  trainer: skipped in other layouts, saying so);
- ``link_drop``: ``--nodes 2`` only: node 1's end of the veth between the nodes down for
  ``--drop-s``, then up on a timer, whether or not the job named the drop meanwhile (the report's
  ``down_s`` says how long).

Per fault: when it was injected, when the harness noticed (the first log line naming it), when
the job was whole again. At the end (benchmarks/chaos_report.py): frames asked and trained,
duplicated or missing rows of ``metrics.csv``, every checkpoint loaded with
``torch.load(weights_only=True)``, shared-memory segments and processes left behind.

    python benchmarks/chaos.py --seed 1 --duration 240 --json /tmp/chaos.json
    python benchmarks/chaos.py --seed 1 --duration 200 --every 20 --mode sync --json /tmp/sync.json
    python benchmarks/chaos.py --nodes 2 --kinds link_drop --duration 100 --every 16 \
        --frames 200000 --seed 5 --json /tmp/drops.json
    python benchmarks/chaos.py --kinds worker_stop --duration 60 --every 20 --frames 150000 --seed 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos_disk import Disk, mount_disk, slow_disk_fault
from chaos_nodes import link_drop_fault, node_commands
from chaos_report import final_checks, print_table, rows_of, run_files
from collector_kills import ancestors, worker_of
from jobs import job_env

from harness.testing.netns import Node, two_nodes

KINDS = (
    "worker_kill",
    "worker_hang",
    "env_raise",
    "env_nan",
    "trainer_kill",
    "refused_launch",
    "joiner_kill",
    "collector_rank_kill",
    "disk_full",
    "collector_rank_stop",
    "slow_disk",
    "link_drop",
    "worker_stop",
)
# The kinds drawn from unless --kinds says otherwise: the twelve of the documented runs, so that a
# seed draws the schedule it drew there (worker_stop came later: name it in --kinds).
DEFAULT_KINDS = KINDS[:-1]
COLLECTORS = 4
# --by-frames: the schedule's end falls at this share of the job's frames, the rest left for the
# last faults' recoveries
FRAMES_SHARE = 0.6
WHOLE_WAIT_S = 60.0  # the longest a fault waits for the job to be whole again from the one before


@dataclass
class Job:
    """The running job: its launcher, its output lines with their arrival times, its settings."""

    proc: subprocess.Popen
    run: Path
    disk: Disk | None  # the run directory's own (disk_full, slow_disk), if one could be mounted
    no_disk: str | None  # why there is none
    chaos_dir: Path
    overrides: list[str]
    env: dict[str, str]
    port: int
    tag: str
    trainers: int
    world: int
    nodes: tuple[Node, Node] | None = None  # --nodes 2: the namespaces; node 1's agent in others
    others: list[subprocess.Popen] = field(default_factory=list)
    lines: list[tuple[float, str]] = field(default_factory=list)
    t0: float = 0.0

    @property
    def launchers(self) -> list[subprocess.Popen]:
        return [self.proc, *self.others]

    @property
    def exit_status(self) -> int | None:
        """The first launcher's that failed, else the first one's."""
        codes = [p.returncode for p in self.launchers]
        return next((c for c in codes if c), codes[0])

    def run_on_head(self, argv: list[str]) -> list[str]:
        """``argv`` where the job's first node is (its namespace, with --nodes 2)."""
        return argv if self.nodes is None else self.nodes[0].run(argv)

    @property
    def head_address(self) -> str:
        return "127.0.0.1" if self.nodes is None else self.nodes[0].address

    def since(self, t: float) -> list[tuple[float, str]]:
        return [(at, line) for at, line in list(self.lines) if at >= t]

    def wait_line(self, pattern: str, after: float, timeout: float) -> tuple[float, str] | None:
        """The first output line after ``after`` that matches ``pattern``, waiting for it."""
        deadline = time.monotonic() + timeout
        while True:
            for at, line in self.since(after):
                if re.search(pattern, line):
                    return at, line.strip()
            if time.monotonic() > deadline or self.proc.poll() is not None:
                return None
            time.sleep(0.2)

    @property
    def collector_ranks(self) -> range:
        return range(self.trainers, self.world)

    def any_collector(self, seed: int) -> int:
        """A collector rank drawn from ``seed`` and the clock."""
        return random.Random(f"{seed}-{time.monotonic()}").choice(self.collector_ranks)

    def rank_pid(self, rank: int) -> int | None:
        """Rank ``rank``'s process: a child of the launcher whose environment says RANK=rank."""
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and set(ancestors(int(entry.name))[:1]) & {
                p.pid for p in self.launchers
            }:
                try:
                    environ = (entry / "environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                if f"RANK={rank}".encode() in environ:
                    return int(entry.name)
        return None


def process_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_job(tmp: Path, args: argparse.Namespace, nodes: tuple[Node, Node] | None) -> Job:
    disk, no_disk = mount_disk(tmp, args)
    run, chaos_dir = (disk.path if disk else tmp) / "run", tmp / "chaos"
    port, tag = free_port(), uuid.uuid4().hex
    chaos_dir.mkdir()
    overrides = [
        "env.id=chaos_env:ChaosCartPole-v0",
        f"collector.mode={args.mode}",
        f"sync={args.scheme}",
        f"topology.trainers={args.trainers}",
        *([f"topology.join_port={port}"] if joinable(args) else []),
        f"seed={args.seed}",
        f"dist_late_s={args.late_s}",
        f"sync.late_s={args.late_s}",
        f"collector.total_frames={args.frames}",
        f"collector.max_restarts={args.collector_restarts}",
        f"collector.watchdog_s={args.watchdog_s}",
        "collector.max_env_restarts=20",
        f"checkpoint.every_frames={args.checkpoint_every}",
        "logger.log_every_frames=2048",
        "logger.console=false",
        f"run_dir={run}",
    ]
    env = job_env({"CHAOS_DIR": str(chaos_dir), "CHAOS_TAG": tag})
    per_node = -(-(args.trainers + COLLECTORS) // args.nodes)  # 2 nodes: the same number each
    commands: list[tuple[list[str], dict[str, str]]]
    if nodes is None:
        commands = [
            (
                [
                    sys.executable,
                    "-m",
                    "harness.cli.launch",
                    "--standalone",
                    f"--nproc_per_node={per_node}",
                    f"--max-restarts={args.max_restarts}",
                    "-m",
                    "harness.train",
                    *overrides,
                ],
                {},
            )
        ]
    else:
        argv = ["-m", "harness.train", *overrides]
        commands = node_commands(nodes, per_node, argv, args, tag)
    procs = [
        subprocess.Popen(
            cmd,
            cwd=tmp,
            env={**env, **extra},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for cmd, extra in commands
    ]
    world = per_node * args.nodes
    job = Job(procs[0], run, disk, no_disk, chaos_dir, overrides, env, port, tag, args.trainers,
              world, nodes, procs[1:])  # fmt: skip
    for proc in procs:
        output = proc.stdout
        assert output is not None  # stdout=PIPE
        threading.Thread(
            target=lambda out=output: job.lines.extend((time.monotonic(), line) for line in out),
            daemon=True,
        ).start()
    return job


def schedule(seed: int, duration: float, every: float, kinds: list[str]) -> list[tuple[float, str]]:
    """Fault times (seconds after the job's first row) and kinds: each kind in turn, in an order
    drawn from ``seed``, at times drawn uniformly over the duration."""
    draw = random.Random(seed)
    count = max(1, round(duration / every))
    order = draw.sample(kinds, len(kinds))
    times = sorted(draw.uniform(5.0, duration) for _ in range(count))
    return [(t, order[i % len(order)]) for i, t in enumerate(times)]


# x86-64 system calls that wait on file descriptors (poll, select, pselect6, ppoll): a worker in
# one waits on its rank's pipe, between batches (an env step of ChaosCartPole sleeps 2 ms in
# clock_nanosleep, so the process state, S either way, cannot tell the two apart)
FD_WAITS = {"7", "23", "270", "271"}


def waiting_state(pid: int, within_s: float = 5.0) -> str:
    """``pid``'s state once its main thread waits on a file descriptor (a worker waiting on its
    rank, between batches: ``S, waiting``), or whatever it is after ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            call = Path(f"/proc/{pid}/syscall").read_text().split()[0]
        except (OSError, IndexError):
            break
        if call in FD_WAITS:
            return f"{process_state(pid)}, waiting"
        time.sleep(0.0005)
    return process_state(pid)


def supervised_fault(job: Job, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """SIGKILL or SIGSTOP/SIGCONT of a random collector's worker; ``worker_stop``: SIGSTOP of one
    caught waiting (between batches), named by its pulse rather than its steps."""
    rank = job.any_collector(args.seed)
    pid = next(filter(None, (worker_of(rank, p.pid) for p in job.launchers)), None)
    if pid is None:
        return {"skipped": f"collector rank {rank} has no worker now"}
    # R: stepping its envs; S: waiting, between batches
    state = waiting_state(pid) if kind == "worker_stop" else process_state(pid)
    at = time.monotonic()
    if kind == "worker_kill":
        os.kill(pid, signal.SIGKILL)
        cause, wait_s = "was killed by SIGKILL", 60.0
    else:
        os.kill(pid, signal.SIGSTOP)
        cause, wait_s = "(?:took no env step|showed no sign of life)", args.hang_s
    noticed = job.wait_line(rf"collector rank {rank}: its worker \(pid {pid}\) {cause}", at, wait_s)
    if kind in ("worker_hang", "worker_stop"):
        time.sleep(max(0.0, at + args.hang_s - time.monotonic()))
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:  # its rank killed it
            pass
    record: dict[str, Any] = {
        "target": f"collector rank {rank} worker pid {pid} ({state})",
        "at": at,
    }
    if noticed:
        whole = job.wait_line(rf"collector rank {rank}: the replacement's first batch", at, 60)
        record.update(noticed=noticed, whole=whole)
    elif kind != "worker_kill" and Path(f"/proc/{pid}").exists():
        record["note"] = f"not noticed within --hang-s ({args.hang_s:g} s): it went on at SIGCONT"
        record["whole"] = (time.monotonic(), "SIGCONT: it went on")
    return record


def env_fault(job: Job, kind: str) -> dict[str, Any]:
    mode = kind.removeprefix("env_")
    at = time.monotonic()
    (job.chaos_dir / mode).touch()
    pattern = "raised RuntimeError: chaos" if mode == "raise" else "not finite"
    noticed = job.wait_line(rf"env .*{pattern}.*making it again", at, 60)
    return {"target": "the first env to look", "at": at, "noticed": noticed, "whole": noticed}


def rank_fault(job: Job, rank: int) -> dict[str, Any]:
    """SIGKILL of a rank: rank 0 (the trainer) or a collector's rank itself."""
    pid = job.rank_pid(rank)
    if pid is None:
        return {"skipped": f"no rank {rank} now"}
    last = rows_of(job.run)[-1:]
    at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    # The agent names the dead rank at once (harness.cli.launch passes a failure other than a
    # usage error straight on); the new attempt's resume follows.
    noticed = job.wait_line(rf"failed \(exitcode: -9\) local_rank: {rank}|resumed from", at, 180)
    record = {"target": f"rank {rank} pid {pid}", "at": at, "noticed": noticed}
    return record | restarted(job, at, last)


def rank_stop_fault(job: Job, rank: int, args: argparse.Namespace) -> dict[str, Any]:
    """SIGSTOP of a collector's rank (not its worker) for ``--hang-s``, then SIGCONT. A trainer
    names it once it has waited ``--late-s`` for it: for its batch (a sync round; in async mode
    while the other collectors keep sending) or for it to take a weights version (a broadcast);
    whole again when that wait ends."""
    pid = job.rank_pid(rank)
    if pid is None:
        return {"skipped": f"no rank {rank} now"}
    at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    listed = rf"for ranks? (?:[\d, -]*\D)?{rank}\b[\d, -]*, which"  # among the ranks named
    late = rf"collector rank {rank} has sent no batch|{listed}"
    noticed = job.wait_line(late, at, args.hang_s)
    time.sleep(max(0.0, at + args.hang_s - time.monotonic()))
    os.kill(pid, signal.SIGCONT)
    back = rf"collector rank {rank} sent a batch again|weights version \d+ reached every receiver"
    whole = job.wait_line(back, at, 60) if noticed else None
    return {"target": f"rank {rank} pid {pid}", "at": at, "noticed": noticed, "whole": whole}


def restarted(job: Job, at: float, last: list[dict[str, str]]) -> dict[str, Any]:
    """When torchrun's restart after ``at`` was whole again (its first row), and the frames it
    trained again (logged after the checkpoint it resumed from, then lost)."""
    resumed = job.wait_line(r"resumed from", at, 180)
    whole = None
    if resumed:  # the resumed run's first row
        count = len(rows_of(job.run))
        deadline = time.monotonic() + 120
        while len(rows_of(job.run)) <= count and time.monotonic() < deadline:
            time.sleep(0.2)
        if len(rows_of(job.run)) > count:
            whole = (time.monotonic(), f"the resumed run's first row ({resumed[1]})")
    record: dict[str, Any] = {"whole": whole}
    if resumed and last and (frames := re.search(r"frames (\d+)", resumed[1])):
        record["frames_redone"] = int(last[0]["frames"]) - int(frames[1])  # logged, then lost
    return record


def disk_fault(job: Job) -> dict[str, Any]:
    """Fill the run directory's filesystem, leaving room for rows but not for a checkpoint, until
    the job names the full disk; then free it."""
    if job.disk is None:
        return {"skipped": f"no small disk: {job.no_disk}"}
    last = rows_of(job.run)[-1:]
    filler = job.disk.path / "filler"
    at = time.monotonic()
    with filler.open("wb") as f:
        f.write(b"\0" * max(shutil.disk_usage(job.disk.path).free - 48 * 1024, 0))
    try:
        noticed = job.wait_line(r"cannot be written: the disk is full", at, 180)
    finally:
        filler.unlink()
    record = {"target": f"{job.disk.path} ({job.disk.kind})", "at": at, "noticed": noticed}
    return record | restarted(job, at, last) if noticed else record


def refused_fault(job: Job) -> dict[str, Any]:
    before = run_files(job.run)
    at = time.monotonic()
    # one process: its own trainer and collector (a second trainer would need ranks of its own)
    overrides = [o for o in job.overrides if not o.startswith("topology.trainers=")]
    out = subprocess.run(
        [sys.executable, "-m", "harness", "train", "--nproc", "1", *overrides],
        cwd=job.run.parent, env=job.env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    end = time.monotonic()
    after = run_files(job.run)
    text = out.stdout + out.stderr
    found = re.search(r"run_dir .* is in use by another launch[^\n]*", text)
    return {
        "target": "harness train --nproc 1 on the same run_dir",
        "at": at,
        "noticed": (end, found[0][:160]) if found and out.returncode else None,
        "whole": (end, "the job ran on") if job.proc.poll() is None else None,
        "exit_status": out.returncode,
        "changed": changed_files(before, after),
    }


def changed_files(before: dict[str, bytes], after: dict[str, bytes]) -> list[str]:
    """Files the refused launch changed: any but what the running owner does meanwhile (append
    rows to metrics.csv, write new checkpoints and rotate old ones out)."""
    changed = []
    for name, data in before.items():
        now = after.get(name)
        if now is None and name.startswith("checkpoints/"):
            continue  # rotated out by the owner
        if name == "metrics.csv" and now is not None and now.startswith(data):
            continue
        if now != data:
            changed.append(name)
    changed += [n for n in after if n not in before and not n.startswith(("checkpoints/", "met"))]
    return changed


def joiner_fault(job: Job) -> dict[str, Any]:
    joiner = subprocess.Popen(
        job.run_on_head(
            [sys.executable, "-m", "harness", "join", f"{job.head_address}:{job.port}"]
        ),
        cwd=job.run.parent, env=job.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    joined = job.wait_line(
        rf"another launch \([^)]*pid {joiner.pid}\) joined", time.monotonic(), 120
    )
    at = time.monotonic()
    joiner.kill()
    joiner.wait()
    if joined is None:
        return {"target": f"joiner pid {joiner.pid}", "at": at, "note": "it never joined"}
    noticed = job.wait_line(rf"pid {joiner.pid}\) (dropped|left)", at, 150)
    return {"target": f"joiner pid {joiner.pid}", "at": at, "noticed": noticed, "whole": noticed}


def joinable(args: argparse.Namespace) -> bool:
    """Whether collectors may join this layout (topology.join_port refuses the others)."""
    return args.mode == "async" and args.trainers == 1


def unfit(kind: str, args: argparse.Namespace) -> str | None:
    """Why ``kind`` cannot be injected in this layout; None when it can."""
    if kind == "joiner_kill" and not joinable(args):
        return "collectors join only an async job with one trainer (topology.join_port refuses it)"
    if kind == "link_drop" and args.nodes == 1:
        return "one node: no link between nodes to drop (--nodes 2)"
    return None


def inject(job: Job, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    if why := unfit(kind, args):
        return {"skipped": why}
    if kind in ("worker_kill", "worker_hang", "worker_stop"):
        return supervised_fault(job, kind, args)
    if kind.startswith("env_"):
        return env_fault(job, kind)
    if kind == "trainer_kill":
        return rank_fault(job, 0)
    if kind == "collector_rank_kill":
        return rank_fault(job, job.any_collector(args.seed))
    if kind == "collector_rank_stop":
        return rank_stop_fault(job, job.any_collector(args.seed), args)
    if kind == "disk_full":
        return disk_fault(job)
    if kind == "slow_disk":
        return slow_disk_fault(job, args)
    if kind == "link_drop":
        return link_drop_fault(job, args)
    if kind == "refused_launch":
        return refused_fault(job)
    return joiner_fault(job)


def relative(job: Job, record: dict[str, Any], kind: str, planned: float) -> dict[str, Any]:
    """A fault's record with times in seconds from the job's first row."""
    out: dict[str, Any] = {"kind": kind, "planned_s": round(planned, 1)}
    for key, value in record.items():
        if key == "at":
            out["injected_s"] = round(value - job.t0, 2)
        elif key in ("noticed", "whole"):
            out[f"{key}_s"] = round(value[0] - job.t0, 2) if value else None
            out[f"{key}_by"] = value[1] if value else None
        else:
            out[key] = value
    return out


def due(job: Job, planned: float, args: argparse.Namespace) -> bool:
    """Whether a fault planned ``planned`` seconds into the schedule is due: that many seconds
    after the job's first row, or with ``--by-frames`` once the job logged the same share of
    ``FRAMES_SHARE`` of its frames (on a loaded machine the job and its recoveries slow down
    together, and the last fault still comes before the job's end)."""
    if not args.by_frames:
        return time.monotonic() - job.t0 >= planned
    rows = rows_of(job.run)
    frames = int(rows[-1]["frames"]) if rows else 0
    return frames >= FRAMES_SHARE * args.frames * planned / args.duration


def chaos(job: Job, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Wait for the first row, then inject the schedule until its end or the job's: one fault at a
    time, each once the job is whole again from the one before, or with ``--overlap`` each at its
    planned time, whatever the faults before it are still doing."""
    while not rows_of(job.run) and job.proc.poll() is None:
        time.sleep(0.5)
    job.t0 = time.monotonic()
    faults: list[dict[str, Any]] = []
    threads = []

    def one(planned: float, kind: str) -> None:
        if job.proc.poll() is not None:
            faults.append({"kind": kind, "planned_s": round(planned, 1), "skipped": "job ended"})
            return
        faults.append(relative(job, inject(job, kind, args), kind, planned))
        print(json.dumps(faults[-1]), flush=True)

    for planned, kind in schedule(args.seed, args.duration, args.every, args.kinds):
        while not due(job, planned, args) and job.proc.poll() is None:
            time.sleep(0.2)
        if args.overlap:
            threads.append(threading.Thread(target=one, args=(planned, kind), daemon=True))
            threads[-1].start()
        else:
            one(planned, kind)
    for thread in threads:
        thread.join()
    return sorted(faults, key=lambda f: f["planned_s"])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=1, help="the schedule's and the job's")
    parser.add_argument("--duration", type=float, default=240.0, help="seconds of faults")
    parser.add_argument("--every", type=float, default=20.0, help="mean seconds between faults")
    parser.add_argument("--kinds", nargs="+", default=list(DEFAULT_KINDS), choices=KINDS)
    parser.add_argument("--mode", choices=("async", "sync"), default="async", help="collector.mode")
    parser.add_argument(
        "--scheme", choices=("gloo", "shm", "hierarchical"), default="gloo", help="sync="
    )
    parser.add_argument("--trainers", type=int, choices=(1, 2), default=1, help="topology.trainers")
    parser.add_argument(
        "--nodes", type=int, choices=(1, 2), default=1, help="2: two network namespaces"
    )
    parser.add_argument("--drop-s", type=float, default=10.0, help="link_drop: down for so long")
    parser.add_argument(
        "--late-s", type=float, default=5.0, help="dist_late_s and sync.late_s: name a late rank"
    )
    parser.add_argument("--frames", type=int, help="collector.total_frames (default: 1500/s)")
    parser.add_argument("--checkpoint-every", type=int, default=20480)
    parser.add_argument("--max-restarts", type=int, default=10, help="torchrun's")
    parser.add_argument("--collector-restarts", type=int, default=50)
    parser.add_argument("--watchdog-s", type=float, default=10.0)
    parser.add_argument("--hang-s", type=float, default=15.0, help="SIGSTOP to SIGCONT")
    parser.add_argument("--disk-mb", type=int, default=64, help="the run directory's disk")
    parser.add_argument(
        "--slow-bps", type=int, default=16384, help="slow_disk: its writes, bytes per second"
    )
    parser.add_argument(
        "--overlap", action="store_true", help="inject each fault on time, not after the last"
    )
    parser.add_argument(
        "--by-frames",
        action="store_true",
        help=f"time the schedule by the job's frames: its end at {FRAMES_SHARE:g} of --frames",
    )
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--log", help="write the job's output here, each line's time before it")
    args = parser.parse_args()
    if args.nodes == 2 and args.scheme == "shm":
        parser.error("--scheme shm reaches trainer 0's node only: use gloo or hierarchical")
    args.frames = args.frames or int(1500 * args.duration)
    return args


def main() -> int:
    args = parse_args()
    shm_before = set(os.listdir("/dev/shm"))
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp, ExitStack() as stack:
        nodes = stack.enter_context(two_nodes("c")) if args.nodes == 2 else None
        job = start_job(Path(tmp), args, nodes)
        try:
            faults = chaos(job, args)
            for proc in job.launchers:
                proc.wait(timeout=args.duration + 900)
        finally:
            for proc in job.launchers:
                if proc.poll() is None:
                    proc.kill()
        try:
            report = final_checks(job, args, faults, shm_before)
        finally:
            if job.disk is not None:
                job.disk.unmount()
    if args.log:
        Path(args.log).write_text("".join(f"{at - job.t0:9.2f} {line}" for at, line in job.lines))
    print_table(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
