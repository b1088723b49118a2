"""What a practitioner sees in the first hour (issue 30, item 13): TensorBoard's
config table; ``harness.evaluate --help``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from helpers import launch_env, run_harness

TINY = ["debug=tiny"]  # 1,024 frames, a row every 256
TOKEN = "not-a-real-token-0123456789"


class Run(NamedTuple):
    run_dir: Path
    out: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Run:
    """One tiny run of scripts/train.sh's shape (torchrun, 1 trainer + 2 collectors, ``trainer.threads=auto``
    under ``OMP_NUM_THREADS=1``), its output piped, evaluating every 256 frames and at the end, writing
    TensorBoard, with a token in its config that only the environment holds."""
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


@pytest.mark.e2e
def test_tensorboard_holds_the_config_as_a_table_without_secrets(finished_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(finished_run.run_dir / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    (written,) = events.Tensors("hyperparameters/text_summary")
    table = written.tensor_proto.string_val[0].decode()
    assert written.step == 0 and table.startswith("|setting|value|\n|-|-|\n"), table[:200]
    for row in ("|algo.name|ppo|", "|env.id|CartPole-v1|", "|collector.total_frames|1024|", "|seed|1|"):
        assert row in table, table
    assert "${oc.env:HARNESS_TEST_TOKEN}" in table  # as config.yaml holds it: unresolved
    files = list((finished_run.run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert files and not any(TOKEN.encode() in f.read_bytes() for f in files)


@pytest.mark.e2e
def test_evaluate_help_prints_the_usage_and_exits_0(workdir):
    for args in (["--help"], ["-h"], ["runs/some-run", "--help"]):
        out = subprocess.run(
            [sys.executable, "-m", "harness.evaluate", *args], cwd=workdir, env=launch_env(), capture_output=True, text=True
        )
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        assert out.stdout.startswith("usage: python -m harness.evaluate RUN_DIR") and "episodes=N" in out.stdout, out.stdout
        assert not out.stderr, out.stderr
