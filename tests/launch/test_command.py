"""The ``harness`` command as the README's set-up installs it (``.venv/bin/harness``, beside this
Python): every verb's ``--help``, a one-process run, a mistake said in one line with exit status
2, a quiet Ctrl-C while it imports; and how ``harness train`` splits its command line between
torchrun and the entry point."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import BIN, launch_env, rows, wait_for

from harness.cli import jobs
from harness.cli.main import VERBS
from harness.cli.usage import UsageError

HARNESS = str(BIN / "harness")


def harness(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [HARNESS, *args], cwd=cwd, env=launch_env(), capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.e2e
@pytest.mark.parametrize(
    "verb", [*(v for v in VERBS if v != "results"), "results sota", "results offline"]
)
def test_every_verb_prints_its_help_and_exits_0(workdir, verb):
    out = harness([*verb.split(), "--help"], workdir)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith(f"usage: harness {verb}"), out.stdout[:500]
    assert not out.stderr, out.stderr[-3000:]


@pytest.mark.e2e
def test_the_command_lists_its_verbs_and_python_m_harness_is_the_same_command(workdir):
    listed = harness(["--help"], workdir)
    assert listed.returncode == 0 and all(f"  {verb} " in listed.stdout for verb in VERBS)
    same = subprocess.run(
        [sys.executable, "-m", "harness", "--help"],
        cwd=workdir,
        env=launch_env(),
        capture_output=True,
        text=True,
    )
    assert same.returncode == 0 and same.stdout == listed.stdout


@pytest.mark.e2e
def test_train_settings_help_is_harness_trains_own(workdir):
    out = harness(["train", "algo=sac", "env=pendulum", "--help"], workdir)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "--nproc N" in out.stdout and out.stdout.count("Settings (") == 1
    assert "algo.policy_lr=0.0003" in out.stdout  # SAC's settings: the composition asked for


@pytest.mark.e2e
def test_train_nproc_1_is_one_process_that_trains_and_collects(workdir):
    out = harness(
        ["train", "--nproc", "1", "debug=tiny", "trainer.threads=1", "run_dir=run"], workdir
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "run finished: frames 1,024 of 1,024" in out.stdout
    assert (workdir / "run" / "layout.json").read_text().startswith('{"world_size": 1,')
    assert rows(workdir / "run")[-1]["frames"] == "1024"


@pytest.mark.e2e
@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["train", "debug=tiny", "algo.lrr=1"],  # 3 ranks through torchrun: rank 0 says it
            "error: algo.lrr: no such setting in algo; did you mean algo.lr?",
        ),
        (["nosuchverb"], "error: nosuchverb is not a verb of harness; the verbs: train, evaluate"),
        ([], "error: give a verb: train, evaluate, join, dataset, plot, results, gpu-check"),
        (["train", "--nprocs", "2"], "error: --nprocs is not a flag of harness train; did you"),
        (["train", "--nproc", "0"], "error: --nproc 0: the number of processes must be a whole"),
        (["train", "--nproc", "1", "--max-restarts", "2"], "error: --nproc 1 runs one process"),
        (["train", "--max-restarts", "x"], "error: argument --max-restarts/--max_restarts"),
        (["evaluate", "nowhere"], "error: nowhere is not a run directory (no config.yaml)"),
        (["evaluate", "."], "error: . is not a run directory"),
        (["join", "localhost"], "error: harness join takes HOST:PORT"),
        (["plot", "nowhere"], "error: nowhere has no metrics.csv: is it a run directory?"),
        (["plot"], "error: give run directories, --presets ROOT or --bench FILE.json"),
        (["results", "sota", "--only", "nosuch"], "error: argument --only: invalid choice"),
        (["results", "offline", "algo.lr=1"], "error: algo.lr=1 changes the presets: name"),
        (["results", "offline", "--recipe", "nope"], "error: --recipe nope: no conf/recipe/nope"),
        (["gpu-check", "--dryrun"], "error: unrecognized arguments: --dryrun"),
    ],
)
def test_a_mistake_is_one_line_and_exit_status_2(workdir, args, message):
    out = harness(args, workdir)
    said = (out.stdout + out.stderr).strip().splitlines()
    assert out.returncode == 2, said
    assert len(said) == 1 and said[0].startswith(message), said


@pytest.mark.e2e
def test_results_offline_refuses_run_directories_of_earlier_runs_and_writes_nothing(workdir):
    earlier = workdir / "runs" / "offline" / "bc_pendulum_medium-data0-seed1"
    earlier.mkdir(parents=True)
    log = earlier.parent / f"{earlier.name}.log"
    log.write_text("the earlier run's log")
    out = harness(["results", "offline", "--root", str(workdir), "--algos", "bc"], workdir)
    said = (out.stdout + out.stderr).strip().splitlines()
    assert out.returncode == 2, said
    assert said == [
        f"error: {earlier} is an earlier run's (2 such paths): name these runs with --label NAME, "
        "table the earlier ones with --summarize, or move them away"
    ]
    assert log.read_text() == "the earlier run's log"
    assert not (workdir / "datasets").exists()  # refused before the dataset was made


@pytest.mark.e2e
def test_ctrl_c_while_the_command_imports_ends_it_without_a_traceback(workdir):
    job = subprocess.Popen(
        [HARNESS, "train", "--nproc", "1", "debug=tiny", "trainer.threads=1", "run_dir=run"],
        cwd=workdir,
        env=launch_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C's default action, as a shell's foreground job has it (tests/terminal.py)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )

    def importing_torch() -> bool:
        try:
            return "/torch/" in Path(f"/proc/{job.pid}/maps").read_text()
        except OSError:  # it ended: the assertions below say how
            return True

    wait_for(importing_torch, 120, "the command importing torch")
    job.send_signal(signal.SIGINT)
    out, _ = job.communicate(timeout=120)
    assert job.returncode in (-signal.SIGINT, 128 + signal.SIGINT), out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]


@pytest.mark.unit
def test_the_command_imports_no_torch_and_no_hydra_before_a_verb_runs():
    probe = (
        "import sys, harness.cli.main\n"
        "print(sorted(m for m in ('torch', 'hydra', 'omegaconf') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.unit
def test_train_passes_torchruns_flags_to_torchrun_and_the_rest_to_the_entry_point():
    nproc, torchrun, rest = jobs.split(
        jobs.TRAIN,
        ["--nproc=5", "--max-restarts", "2", "-m", "seed=1,2", "--cfg", "job", "sync=shm"],
    )
    assert (nproc, torchrun) == (5, ["--max-restarts=2"])
    assert rest == ["-m", "seed=1,2", "--cfg", "job", "sync=shm"]  # -m: Hydra's multirun
    assert jobs.split(jobs.TRAIN, ["debug=tiny"]) == (3, [], ["debug=tiny"])
    assert jobs.split(jobs.DATASET, ["out=d"]) == (1, [], ["out=d"])
    assert jobs.split(jobs.JOIN, ["--nproc", "4", "host:29480"]) == (4, [], ["host:29480"])


@pytest.mark.unit
def test_a_job_is_standalone_unless_torchruns_flags_say_where_its_nodes_meet():
    assert jobs.launch_flags(3, ["--max-restarts=2"]) == [
        "--standalone",
        "--nproc-per-node=3",
        "--max-restarts=2",
    ]
    nodes = ["--nnodes=2", "--rdzv-endpoint=head:29500", "--rdzv-backend=c10d"]
    assert jobs.launch_flags(4, nodes) == ["--nproc-per-node=4", *nodes]


@pytest.mark.unit
def test_a_flag_that_neither_torchrun_nor_hydra_knows_is_refused_naming_the_nearest():
    with pytest.raises(UsageError, match=r"--nnode is not a flag of harness train; did you mean"):
        jobs.split(jobs.TRAIN, ["--nnode", "2"])
    with pytest.raises(UsageError, match="--module is not a flag of harness train"):
        jobs.split(jobs.TRAIN, ["--module", "x"])  # the verb chooses what runs
