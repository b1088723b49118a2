"""The SLURM scripts on a real SLURM (munged, slurmctld, slurmd) started here.

Needs root and the slurm-wlm package (``.ci/run`` installs it); skips, saying
which, where either is missing. The daemons run as root with a minimal
slurm.conf (below) that claims 4 CPUs, so that 3-4 tasks fit on 2 cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, column, launch_env, rows, wait_for

pytestmark = pytest.mark.slurm

ENDED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}

CONF = """ClusterName=harness-test
SlurmctldHost=localhost
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/ctld
SlurmdSpoolDir={d}/d
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=20
SlurmdParameters=config_overrides
NodeName=localhost CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = [
        b
        for b in ("munged", "slurmctld", "slurmd", "sbatch")
        if not shutil.which(b) and not Path(f"/usr/sbin/{b}").exists()
    ]
    if missing:
        pytest.skip(
            f"SLURM is not installed here ({', '.join(missing)} missing): apt-get install "
            f"slurm-wlm, as .ci/run does"
        )
    if os.geteuid() != 0:
        pytest.skip("starting SLURM's daemons needs root")
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("ctld", "d"):
        (d / sub).mkdir()
    (d / "slurm.conf").write_text(CONF.format(d=d))
    env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
    daemons = []
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        daemons.append(
            subprocess.Popen(["runuser", "-u", "munge", "--", "/usr/sbin/munged", "--foreground"])
        )
        wait_for(lambda: Path("/run/munge/munge.socket.2").exists(), 20, "munged")
    daemons.append(
        subprocess.Popen(["/usr/sbin/slurmctld", "-D", "-i", "-f", str(d / "slurm.conf")], env=env)
    )
    daemons.append(
        subprocess.Popen(
            ["/usr/sbin/slurmd", "-D", "-N", "localhost", "-f", str(d / "slurm.conf")], env=env
        )
    )
    try:

        def idle():
            out = subprocess.run(
                ["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True
            ).stdout
            return "idle" in out

        wait_for(idle, 60, "slurmd to register")
        yield env
        # Jobs may still be ending (submitit returns when its tasks' results
        # are written); job steps left behind a stopped slurmd live on.
        subprocess.run(["scancel", "--partition=debug"], env=env, check=False)
        wait_for(lambda: not squeue(env), 60, "SLURM's queue to empty")
    finally:
        for p in reversed(daemons):
            p.terminate()
        for p in daemons:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


def squeue(env: dict, *args: str) -> str:
    return subprocess.run(
        ["squeue", "-h", *args], env=env, capture_output=True, text=True
    ).stdout.strip()


def submit(
    script: str, args: list[str], env: dict, cwd: Path, options: tuple[str, ...] = ()
) -> str:
    """``sbatch`` a script with its log at ``cwd/job.out``; the job's id."""
    command = [
        "sbatch",
        "--parsable",
        "-o",
        str(cwd / "job.out"),
        *options,
        str(ROOT / script),
        *args,
    ]
    submitted = subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().split(";")[0]


def run_job(
    script: str, args: list[str], env: dict, cwd: Path, options: tuple[str, ...] = ()
) -> tuple[str, str]:
    """Submit, wait for the job to end, and return its final state and log.
    Polled here: ``sbatch --wait`` looks at growing intervals, which cost
    each of these tests about half a minute (a 16-s job took 42 s)."""
    job, state = submit(script, args, env, cwd, options), ""

    def ended() -> bool:
        nonlocal state
        shown = subprocess.run(
            ["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True
        ).stdout
        state = shown.split("JobState=")[1].split()[0] if "JobState=" in shown else ""
        return state in ENDED

    wait_for(ended, 300, f"job {job} to end")
    log = cwd / "job.out"
    return state, log.read_text() if log.exists() else ""


def frames(run_dir: Path) -> list[int]:
    return [int(f) for f in column(rows(run_dir), "frames")]


def job_env(slurm, run_dir: Path, **extra) -> dict:
    return {
        **slurm,
        "HARNESS_DIR": str(ROOT),
        "RUN_DIR": str(run_dir),
        "OMP_NUM_THREADS": "1",
        **extra,
    }


def test_single_node_script_runs_a_tiny_job_to_the_end(slurm, tmp_path):
    args = ["debug=tiny", "logger.console=false"]
    state, log = run_job(
        "slurm/single_node.sbatch", args, job_env(slurm, tmp_path / "run"), tmp_path
    )
    assert state == "COMPLETED", log[-3000:]
    assert frames(tmp_path / "run")[-1] == 1024


def test_multi_node_script_rendezvous_of_two_node_tasks(slurm, tmp_path):
    """Two srun tasks on localhost stand in for two nodes: each a torchrun
    agent, meeting at the c10d rendezvous the script derives from the node list."""
    args, two_tasks = (
        ["debug=tiny", "sync=hierarchical", "logger.console=false"],
        ("--nodes=1", "--ntasks=2", "--ntasks-per-node=2"),
    )
    env = job_env(slurm, tmp_path / "run", NNODES="2", NPROC="2")
    state, log = run_job("slurm/multi_node.sbatch", args, env, tmp_path, two_tasks)
    assert state == "COMPLETED", log[-3000:]
    assert "--rdzv_endpoint=localhost:" in log
    assert frames(tmp_path / "run")[-1] == 1152  # 3 collectors x 64 frames a round


def test_requeued_job_resumes_from_its_checkpoint(slurm, tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "debug=tiny",
        "logger.console=false",
        "collector.total_frames=20480",
        "checkpoint.every_frames=2048",
        "logger.log_every_frames=2048",
    ]
    job = submit("slurm/single_node.sbatch", args, job_env(slurm, run_dir), tmp_path)
    wait_for(lambda: list((run_dir / "checkpoints").glob("step-*")), 120, "the first checkpoint")
    subprocess.run(["scontrol", "requeue", job], env=slurm, check=True)
    # SLURM holds a requeued job back for a while before it may start again;
    # let it start as soon as it is pending.
    wait_for(
        lambda: "PENDING" in squeue(slurm, "-j", job, "-o", "%T"),
        120,
        "the job to be requeued",
    )
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=slurm, check=True)

    def finished():
        return (
            squeue(slurm, "-j", job) == ""
            and (run_dir / "metrics.csv").exists()
            and frames(run_dir)[-1] == 20480
        )

    wait_for(finished, 400, "the requeued job to finish")
    log = (tmp_path / "job.out").read_text()
    assert "resumed from" in log, log[-3000:]
    seen = frames(run_dir)
    assert seen == sorted(set(seen)) and seen[-1] == 20480


def test_submitit_sweep_runs_one_multi_task_job_per_combination(slurm, tmp_path):
    """Hydra's submitit launcher: each combination is one SLURM job of two
    tasks that srun starts without torchrun (ranks from SLURM's variables),
    each job in a run directory of its own under the sweep directory."""
    sweep = tmp_path / "sweep"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.train",
            "-m",
            "hydra/launcher=submitit_slurm",
            "hydra.launcher.tasks_per_node=2",
            "hydra.launcher.timeout_min=10",
            f"hydra.sweep.dir={sweep}",
            "debug=tiny",
            "logger.console=false",
            "seed=1,2",
        ],
        env=launch_env({"SLURM_CONF": slurm["SLURM_CONF"]}),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    logs = "".join(p.read_text() for p in sweep.glob(".submitit/*/*_log.*"))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:] + logs[-3000:]
    run_dirs = sorted(p.parent for p in sweep.glob("*/metrics.csv"))
    assert [p.name for p in run_dirs] == [
        "debug=tiny,logger.console=False,seed=1",
        "debug=tiny,logger.console=False,seed=2",
    ]
    for run_dir in run_dirs:
        assert frames(run_dir)[-1] == 1024
    assert (
        logs.count("world size 2, topology.trainers=1") == 2
    )  # two ranks per job, as srun started them
