"""The front door as a newcomer meets it: ``scripts/train.sh`` (``harness train`` after the set-up)
with its default 3 ranks (torchrun).

A mistake in the command is one message from one rank, without a traceback,
and exit status 2; ``--help`` prints once and explains every setting; Ctrl-C
while the ranks start ends the job quietly; a failure that is not a mistake
keeps what torchrun says of it.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, launch_env, wait_for

from harness.cli.launch import children

pytestmark = pytest.mark.e2e
TRAIN_SH = str(ROOT / "scripts" / "train.sh")


def train_sh(
    args: list[str], cwd, nproc: int = 3, env: dict | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TRAIN_SH, *args],
        cwd=cwd,
        env=launch_env({"NPROC": str(nproc), **(env or {})}),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_typo_is_one_line_from_one_rank_naming_the_setting_meant_and_exit_status_2(workdir):
    out = train_sh(["debug=tiny", "algo.lrr=1e-3", f"run_dir={workdir / 'run'}"], workdir)
    said = (out.stdout + out.stderr).strip().splitlines()
    assert said == [
        "error: algo.lrr: no such setting in algo; did you mean algo.lr? "
        "(--help lists every setting)"
    ], said
    assert out.returncode == 2
    assert not (workdir / "run").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["+foo=1"], "error: unknown config keys: foo."),
        (["algo=sac", "env=cartpole"], "error: algo=sac needs continuous actions"),
        (
            ["algo=ppp"],
            "error: algo=ppp: no such option; did you mean algo=ppo? "
            "Choose one of: bc, cql, dqn, iql, ppo, sac, td3",
        ),
        (
            ["topology.trainers=3"],
            "error: topology.trainers=3 with world size 3 leaves no rank to collect",
        ),
        (
            ["seed=abc"],
            "error: Error merging override seed=abc: "
            "Value 'abc' of type 'str' could not be converted to Integer",
        ),
        (
            ["+experiment=null"],
            "error: a config group takes an option (group=option); "
            "to choose none, leave the group out",
        ),
    ],
)
def test_a_mistake_is_a_message_said_once_not_a_traceback(workdir, args, message):
    out = train_sh(["debug=tiny", *args, f"run_dir={workdir / 'run'}"], workdir)
    said = out.stdout + out.stderr
    assert out.returncode == 2, said[-3000:]
    assert said.startswith(message) and said.count("error:") == 1, said[-3000:]
    assert (
        "Traceback" not in said
        and "Error executing job" not in said
        and "ChildFailedError" not in said
    ), said[-3000:]


def test_help_prints_once_and_says_what_every_setting_of_the_composition_means(workdir):
    out = train_sh(["algo=sac", "env=pendulum", "--help"], workdir)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("Settings (") == 1
    assert (
        "  algo        bc  cql  dqn  iql  ppo  sac*  td3\n" in out.stdout
    )  # the choices only: no *_schema entries
    lines = {
        line.split()[0]: line
        for line in out.stdout.splitlines()
        if line.startswith("  ") and "=" in line.split()[0]
    }
    assert "actor Adam learning rate" in lines["algo.policy_lr=0.0003"]
    assert "gymnasium id" in lines["env.id=Pendulum-v1"]
    # Included by presets, never chosen on the command line: not shown as groups.
    assert not any(line.startswith(("  common ", "  tuned ")) for line in out.stdout.splitlines())


def importing_torch(pid: int) -> bool:
    """Past the interpreter's own start (Ctrl-C there is Python's, before any harness code runs):
    torch's libraries are mapped. (A worker that ended meanwhile counts: the launcher has more to
    say then.)"""
    try:
        return "/torch/" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return True


def test_ctrl_c_while_the_ranks_start_ends_the_job_at_once_without_a_traceback(workdir):
    # A terminal's Ctrl-C reaches the launcher (torchrun starts its workers in sessions of their
    # own), which passes it on; here it comes while the workers import torch, seconds that a Ctrl-C
    # often falls in.
    job = subprocess.Popen(
        [TRAIN_SH, "debug=tiny", f"run_dir={workdir / 'run'}"],
        cwd=workdir,
        env=launch_env({"NPROC": "3"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # As a shell starts a foreground job: Ctrl-C's default action, even when this test run was
        # started in the background (nohup ... &), whose processes inherit SIGINT ignored
        # (tests/terminal.py does the same).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_for(
        lambda: len(workers := children(job.pid)) == 3 and all(map(importing_torch, workers)),
        120,
        "3 workers importing torch",
    )
    job.send_signal(signal.SIGINT)
    out, _ = job.communicate(timeout=120)
    assert job.returncode == 128 + signal.SIGINT, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]


def test_a_failure_that_is_not_a_mistake_keeps_its_traceback_and_torchruns_report(workdir):
    out = train_sh(
        [
            "debug=tiny",
            "env.id=flaky_env:FlakyCartPole-v0",
            "collector.max_env_restarts=0",
            f"run_dir={workdir / 'run'}",
        ],
        workdir,
        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "FLAKY_STEP": "5", "FLAKY_FAILURES": "1000"},
    )
    said = out.stdout + out.stderr
    assert out.returncode not in (0, 2), said[-3000:]
    assert "Traceback" in said and "simulated crash at step 5" in said, said[-3000:]
    assert "failed (exitcode: 1)" in said, said[
        -3000:
    ]  # torchrun's own report, held while the job ran
    # The collectors end at once (they used to wait for the trainer's pending sends while exiting),
    # so the trainer learns that they are gone rather than waiting out dist_timeout_s.
    assert "that collector is gone" in said and "no answer in" not in said, said[-3000:]
