"""A collector whose worker dies or stalls costs its own frames, not the job
(``collector.max_restarts``): its rank replaces the worker and the run goes on."""

from __future__ import annotations

import logging
import os
import signal
import uuid
from pathlib import Path

import pytest
from helpers import ROOT, column, compose_config, launch_env, rows, run_harness, wait_for

from harness.algos import algorithm_for
from harness.roles.supervisor import Supervisor, describe_exit
from harness.sync.payload import Header, Payload, weights_of
from harness.sync.shared_memory import ShmSink
from harness.sync.shm_files import PREFIX, alive

FLAKY = "flaky_env:FlakyCartPole-v0"
ON_PATH = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}
# debug=tiny: 2 collectors of 2 envs, 64-frame batches, 1,024 frames. The failure comes at an
# episode's 10th step once its process took 100 steps: in a worker's second batch or later, after it
# delivered one.
PAST_THE_FIRST_BATCH = {"FLAKY_STEP": "10", "FLAKY_AFTER": "100"}
# Async, one collector has taken at least half the 1,024 frames by the end: after its 440th step it
# fails in the run's last batches, and its replacement's first batch comes too late to be learned
# from (or just in time); the replacement is counted either way.
AS_THE_RUN_ENDS = {"FLAKY_STEP": "10", "FLAKY_AFTER": "440"}


def orphaned_segments() -> set[Path]:
    """Harness segments in /dev/shm whose creator is dead: left behind (other runs' live ones are
    not)."""
    found = set()
    for path in Path("/dev/shm").glob(f"{PREFIX}*"):
        pid = path.name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not alive(int(pid)):
            found.add(path)
    return found


def processes_tagged(tag: str) -> list[int]:
    """Live processes whose environment holds ``HARNESS_TEST_TAG=tag``: a launch's ranks and
    workers."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and f"HARNESS_TEST_TAG={tag}".encode() in (entry / "environ").read_bytes()
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.unit
def test_a_workers_end_is_said_from_its_exit():
    assert (
        describe_exit(-signal.SIGKILL, None)
        == "was killed by SIGKILL (kill -9, or the kernel's OOM killer)"
    )
    assert describe_exit(-signal.SIGSEGV, None) == "was killed by SIGSEGV (a crash in native code)"
    assert "collector.env_step_timeout_s" in describe_exit(70, None)
    assert describe_exit(1, "raised RuntimeError: boom") == "raised RuntimeError: boom"
    assert describe_exit(3, None) == "exited with code 3"


@pytest.mark.unit
def test_replaceable_collectors_are_refused_with_nccl_saying_why(monkeypatch):
    monkeypatch.setattr(
        "torch.cuda.is_available", lambda: True
    )  # past sync=nccl's own check on this CPU machine
    with pytest.raises(
        ValueError, match=r"collector\.max_restarts=2 with sync=nccl: a replaceable collector"
    ):
        compose_config("collector.max_restarts=2", "sync=nccl")


@pytest.mark.e2e
@pytest.mark.parametrize(
    "mode, layout, when, cause",
    [
        ("kill", ["sync=gloo"], PAST_THE_FIRST_BATCH, "was killed by SIGKILL"),
        (
            "segfault",
            ["sync=shm", "collector.mode=async"],
            AS_THE_RUN_ENDS,
            "was killed by SIGSEGV (a crash in native code)",
        ),
        ("abort", ["sync=hierarchical"], PAST_THE_FIRST_BATCH, "was killed by SIGABRT"),
        (
            "hold",
            ["sync=gloo", "collector.watchdog_s=2"],
            PAST_THE_FIRST_BATCH,
            "took no env step for 2 s (collector.watchdog_s); its rank killed it",
        ),
    ],
)
def test_a_worker_that_dies_or_hangs_is_replaced_and_the_run_finishes(
    workdir, mode, layout, when, cause
):
    left_before = orphaned_segments()
    env = {
        **ON_PATH,
        **when,
        "FLAKY_MODE": mode,
        "FLAKY_ONCE": str(workdir / "failed-once"),
    }
    args = [
        "debug=tiny",
        f"env.id={FLAKY}",
        "collector.max_restarts=2",
        "logger.console=false",
        "run_dir=run",
        *layout,
    ]
    out = run_harness(args, workdir, nproc=3, env=env)
    said = out.stdout + out.stderr
    assert out.returncode == 0, said[-3000:]
    assert (workdir / "failed-once").exists()  # the failure happened, once
    assert cause in said and "replaced by pid" in said
    table = rows(workdir / "run")
    assert (
        int(table[-1]["frames"]) == 1024
    )  # every frame learned from came in a delivered batch, once
    assert sum(column(table, "collect/collector_restarts")) == 1
    assert sum(column(table, "collect/frames_lost")) >= 0
    if "collector.mode=async" not in layout:  # the replacement acted with the version of its round
        assert max(column(table, "collect/policy_lag_max")) == 0
    assert orphaned_segments() <= left_before, "the run's shared-memory segments are removed"


@pytest.mark.e2e
def test_past_max_restarts_the_error_names_the_collector_its_env_and_every_cause(workdir):
    tag = uuid.uuid4().hex
    env = {**ON_PATH, **PAST_THE_FIRST_BATCH, "FLAKY_MODE": "segfault", "HARNESS_TEST_TAG": tag}
    args = ["debug=tiny", f"env.id={FLAKY}", "collector.max_restarts=1", "run_dir=run"]
    out = run_harness(args, workdir, nproc=3, env=env)
    said = out.stdout + out.stderr
    assert out.returncode != 0
    assert f"(env {FLAKY}): its worker failed 2 times, more than collector.max_restarts=1" in said
    assert (
        "The causes, in order: 1. was killed by SIGSEGV (a crash in native code); 2. was killed by "
        "SIGSEGV" in said
    )
    wait_for(lambda: not processes_tagged(tag), 10, "every rank and worker of the launch to exit")


@pytest.mark.e2e
def test_a_worker_never_outlives_its_rank(workdir):
    """A collector rank killed outright (torchrun then ends the job): its worker goes with it, and
    nothing stays in /dev/shm."""
    import subprocess

    from helpers import launcher, rank_pid

    tag, left_before = uuid.uuid4().hex, orphaned_segments()
    args = [
        "debug=tiny",
        "collector.total_frames=10000000",
        "collector.max_restarts=2",
        "logger.console=false",
        "run_dir=run",
    ]
    job = subprocess.Popen(
        [*launcher(3), "-m", "harness.train", *args],
        cwd=workdir,
        env=launch_env({"HARNESS_TEST_TAG": tag}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: (
                len(rows(workdir / "run")) >= 2
                if (workdir / "run" / "metrics.csv").exists()
                else False
            ),
            120,
            "rows",
        )
        rank = rank_pid(job, 1)
        workers = [
            p
            for p in processes_tagged(tag)
            if Path(f"/proc/{p}/comm").read_text().strip() == "collector1"
        ]
        assert workers, "collector rank 1 has a worker process"
        os.kill(rank, signal.SIGKILL)
        job.wait(timeout=120)
        wait_for(
            lambda: not processes_tagged(tag),
            30,
            "the killed rank's worker, and every other process, to exit",
        )
    finally:
        if job.poll() is None:
            job.kill()
    wait_for(
        lambda: orphaned_segments() <= left_before,
        30,
        "the killed rank's shared-memory segment to be removed",
    )


@pytest.mark.multiprocess
def test_the_worker_is_the_oom_killers_pick_and_one_stopped_at_the_end_is_killed_not_waited_for(
    caplog,
):
    """Out of memory, the kernel picks the worker (which its rank replaces) before the rank (whose
    death restarts the job). At the stop a rank waits for its worker's exit (up to
    sync.timeout_s); a worker that shows no sign of life meanwhile (SIGSTOPped here, as a hung
    one) is killed after collector.watchdog_s instead of holding up the run's end."""
    cfg = compose_config("debug=tiny", "collector.max_restarts=1", "collector.watchdog_s=1")
    supervisor = Supervisor(cfg, rank=1, first=False)
    supervisor.ready()
    pid = supervisor.worker.process.pid
    score = int(Path(f"/proc/{pid}/oom_score_adj").read_text())
    assert score >= 500 and score > int(Path("/proc/self/oom_score_adj").read_text())
    os.kill(pid, signal.SIGSTOP)
    with caplog.at_level(logging.WARNING):
        supervisor.close(timeout_s=600)  # the test's own timeout ends it long before, if waited
    assert not supervisor.worker.process.is_alive()
    said = f"its worker (pid {pid}) neither stepped nor exited for 1 s after the stop"
    assert said in caplog.text


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_worker_stopped_between_batches_is_named_and_replaced_when_its_rank_next_asks(caplog):
    """Between batches no env step is due, so the step watchdog cannot see a stopped worker there:
    its pulse can. Here it is SIGSTOPped after handing a batch over, while its rank sends it; when
    the rank next asks for a batch, the stopped worker is named within collector.watchdog_s,
    killed and replaced, and the replacement's batch comes."""
    cfg = compose_config(
        "debug=tiny", "collector.mode=async", "collector.max_restarts=1", "collector.watchdog_s=1"
    )
    supervisor = Supervisor(cfg, rank=1, first=False)
    sink = ShmSink(0, readers=1)
    try:
        spec = supervisor.ready()
        algo = algorithm_for(cfg.algo.name, spec)
        models = algo.make_models(cfg.algo, spec)
        names = algo.header_values
        sink.open(lambda: Payload.from_models(models, names, cfg.sync.torch_wire_dtype))
        assert sink.segment is not None  # open() made it
        supervisor.attach(sink.segment.name, header_only=False)
        sink.write(weights_of(models), Header(1, values=dict.fromkeys(names, 0.0)))
        assert supervisor.take() is not None  # the first batch: the worker waits for "sent"
        stopped = supervisor.worker.process.pid
        os.kill(stopped, signal.SIGSTOP)
        supervisor.release()
        with caplog.at_level(logging.WARNING):
            assert supervisor.take() is not None  # the replacement's first batch
        assert supervisor.worker.process.pid != stopped and supervisor.restarts == 1
        said = f"its worker (pid {stopped}) showed no sign of life for"
        assert said in caplog.text and "between batches" in caplog.text
        assert "replaced by pid" in caplog.text
    finally:
        supervisor.close(0.0)
        sink.close()
