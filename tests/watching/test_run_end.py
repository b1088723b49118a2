"""What a practitioner sees in the first hour (issue 30, items 8, 12, 13): the block
that ends a run, with commands that work as written; the console's latest
figures; the thread count that ``OMP_NUM_THREADS`` sets; ``sync=none``'s
version gap; TensorBoard's config table; ``harness.cli.evaluate --help``."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from helpers import column, launch_env, rows, run_harness

from harness.metrics.console import Figures

TINY = ["debug=tiny"]  # 1,024 frames, a row every 256
TOKEN = "not-a-real-token-0123456789"
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # any control character but tab and newline
PROGRESS = re.compile(r"frames +[\d,]+/[\d,]+ .*")


class Run(NamedTuple):
    run_dir: Path
    out: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Run:
    """One tiny run of scripts/train.sh's shape (torchrun, 1 trainer + 2 collectors,
    ``trainer.threads=auto`` under ``OMP_NUM_THREADS=1``), its output piped, evaluating every 256
    frames and at the end, writing TensorBoard, with a token in its config that only the environment
    holds."""
    where = tmp_path_factory.mktemp("finished")
    out = run_harness(
        [
            *TINY,
            "eval.every_frames=256",
            "eval.episodes=1",
            "logger.backends=[csv,tensorboard]",
            "logger.tags=[${oc.env:HARNESS_TEST_TOKEN}]",
            "run_dir=run",
        ],
        where,
        nproc=3,
        env={"HARNESS_TEST_TOKEN": TOKEN},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return Run((where / "run").resolve(), out)


def summary_block(stdout: str) -> list[str]:
    """The lines from ``run finished``/``run stopped`` to the end of the indented block after it."""
    lines = stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"run (finished|stopped)", line)]
    assert len(starts) == 1, stdout[-3000:]
    block = [lines[starts[0]]]
    for line in lines[starts[0] + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line)
    return block


def command(block: list[str], label: str) -> list[str]:
    (line,) = [line for line in block if line.startswith(f"  {label}:")]
    return shlex.split(line.split(":", 1)[1])


@pytest.mark.e2e
def test_a_run_ends_with_one_summary_whose_commands_work_as_written(finished_run, tmp_path):
    run_dir, out = finished_run
    table = rows(run_dir)
    block = summary_block(out.stdout)
    assert len(block) <= 10 and not CONTROL.search("\n".join(block)), block
    assert out.stdout.rindex(block[0]) > out.stdout.rindex(
        "frames       1,024/1,024"
    )  # after the last progress line
    trained = re.fullmatch(r"run finished: frames 1,024 of 1,024, trained for ([\d.]+) s", block[0])
    assert trained and float(trained[1]) >= float(table[-1]["time_s"]) - 0.05, (
        block
    )  # the run's clock, read at the end
    train, final = column(table, "train/episode_return")[-1], float(table[-1]["eval/final_return"])
    assert block[1] == f"  return:   train {train:.1f} | eval {final:.1f} (final weights)"
    assert block[2] == f"  run_dir:  {run_dir}"
    assert (
        f"  train on: the same command with run_dir={run_dir} collector.total_frames=2048" in block
    )

    # The commands, pasted into a shell somewhere else.
    plot = subprocess.run(
        command(block, "plot"),
        cwd=tmp_path,
        env=launch_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plot.returncode == 0, plot.stderr[-3000:]
    assert (run_dir / "curves.png").read_bytes()[:4] == b"\x89PNG"
    evaluate = subprocess.run(
        command(block, "evaluate"), cwd=tmp_path, env=launch_env(), capture_output=True, text=True
    )
    assert evaluate.returncode == 0, evaluate.stderr[-3000:]
    assert re.search(
        rf": return {final:.2f} ± [\d.]+ over 1 deterministic episodes", evaluate.stdout
    ), evaluate.stdout


@pytest.mark.e2e
def test_the_last_progress_line_shows_the_final_weights_evaluation(finished_run):
    """A mid-run evaluation stayed on the console while the last row held eval/final_return (issue
    30, item 8)."""
    run_dir, out = finished_run
    table = rows(run_dir)
    lines = [line for line in out.stdout.splitlines() if PROGRESS.fullmatch(line)]
    assert len(lines) == len(table) == 4, out.stdout
    # an evaluation's return stays on the line until a newer one; the final weights' is the newest
    shown = None
    for line, row in zip(lines, table):
        for key in ("eval/return", "eval/final_return"):
            shown = f"{float(row[key]):.1f}" if row.get(key) not in (None, "", "nan") else shown
        found = re.search(r"\| eval (-?[\d.]+)", line)
        assert (found and found[1]) == shown, (line, row)
    assert shown == f"{float(table[-1]['eval/final_return']):.1f}"


@pytest.mark.unit
def test_figures_take_the_final_evaluation_as_the_latest_and_the_version_gap_for_the_lag():
    figures = Figures()
    figures.update(
        {"train/episode_return": 20.0, "eval/return": -1588.1, "collect/policy_lag_mean": 0.0}
    )
    assert figures.text() == "return 20.0 | eval -1588.1 | lag 0.00" and not figures.eval_final
    figures.update(
        {"train/episode_return": float("nan"), "eval/return": -900.0, "eval/final_return": -283.75}
    )
    assert figures.text() == "return 20.0 | eval -283.8 | lag 0.00" and figures.eval_final
    figures.update(
        {"collect/policy_lag_mean": 0.0, "sync/version_gap": 16}
    )  # sync=none: a lag of 0 says nothing
    assert figures.text() == "return 20.0 | eval -283.8 | gap 16"


@pytest.mark.e2e
def test_threads_auto_takes_omp_num_threads_and_the_layout_says_so(finished_run, workdir):
    """scripts/*.sh (and here the test's environment) export OMP_NUM_THREADS=1: every rank takes it.
    One process took every core's thread: 18.8 s for NPROC=1 scripts/train.sh debug=tiny on 2 busy
    cores, 5.6 s with one (issue 30, item 12)."""
    one = run_harness(
        [*TINY, "logger.console=false", "trainer.threads=auto", "run_dir=run"], workdir
    )
    assert one.returncode == 0, one.stderr[-3000:]
    assert (
        "  rank 0 trainer+collector: cpu, 1 thread (OMP_NUM_THREADS; trainer.threads=N overrides "
        "it)" in one.stdout
    )
    said = finished_run.out.stdout
    assert (
        "  rank 0 trainer: cpu, 1 thread (OMP_NUM_THREADS; trainer.threads=N overrides it)" in said
    ), said[:3000]
    for rank in (1, 2):
        assert (
            f"  rank {rank} collector: cpu, 1 thread (OMP_NUM_THREADS; collector.threads=N "
            f"overrides it)" in said
        )


@pytest.mark.e2e
def test_tensorboard_holds_the_config_as_a_table_without_secrets(finished_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(
        str(finished_run.run_dir / "tensorboard"), size_guidance={"tensors": 0}
    )
    events.Reload()
    (written,) = events.Tensors("hyperparameters/text_summary")
    table = written.tensor_proto.string_val[0].decode()
    assert written.step == 0 and table.startswith("|setting|value|\n|-|-|\n"), table[:200]
    for row in (
        "|algo.name|ppo|",
        "|env.id|CartPole-v1|",
        "|collector.total_frames|1024|",
        "|seed|1|",
    ):
        assert row in table, table
    assert "${oc.env:HARNESS_TEST_TOKEN}" in table  # as config.yaml holds it: unresolved
    files = list((finished_run.run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert files and not any(TOKEN.encode() in f.read_bytes() for f in files)


@pytest.mark.e2e
def test_sync_none_shows_the_version_gap_and_warns_an_on_policy_algorithm_once(workdir):
    out = run_harness([*TINY, "sync=none", "run_dir=run"], workdir, nproc=3)
    assert out.returncode == 0, out.stderr[-3000:]
    said = out.stdout + out.stderr
    assert (
        said.count(
            "sync=none: the collectors keep the weights they start with, but algo=ppo learns "
            "on-policy"
        )
        == 1
    )
    table = rows(workdir / "run")
    gaps = [int(float(r["sync/version_gap"])) for r in table]
    assert (
        gaps == [int(r["sync/version"]) for r in table] and gaps[-1] > 0
    )  # a fresh run: version 0 went out first
    lines = [line for line in out.stdout.splitlines() if PROGRESS.fullmatch(line)]
    assert [line.rsplit("| gap ", 1)[-1] for line in lines] == [str(g) for g in gaps], lines
    assert not any("| lag " in line for line in lines)


@pytest.mark.e2e
def test_evaluate_help_prints_the_usage_and_exits_0(workdir):
    for args in (["--help"], ["-h"], ["runs/some-run", "--help"]):
        out = subprocess.run(
            [sys.executable, "-m", "harness.cli.evaluate", *args],
            cwd=workdir,
            env=launch_env(),
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        assert (
            out.stdout.startswith("usage: harness evaluate RUN_DIR") and "episodes=N" in out.stdout
        ), out.stdout
        assert not out.stderr, out.stderr
