"""A run directory only grows: refused launches change nothing, starting over
moves files aside, damaged checkpoints are never trusted. Real runs, real files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from helpers import ROOT, rows, run_harness, snapshot
from tensordict import TensorDict

from harness.core import checkpoint
from harness.data import dataset
from harness.rundir import directory as run_directory
from harness.rundir.lock import LOCK_NAME

TINY = ["debug=tiny", "logger.console=false", "checkpoint.every_frames=256", "run_dir=run"]


@pytest.fixture(scope="module")
def run_once(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("finished")
    out = run_harness(TINY, where)
    assert out.returncode == 0, out.stderr[-3000:]
    return where / "run"


@pytest.fixture
def finished_run(workdir, run_once) -> Path:
    """A finished tiny run in this test's own directory (a copy of one made once: the tests change
    or extend it)."""
    shutil.copytree(run_once, workdir / "run")
    return workdir / "run"


@pytest.mark.e2e
@pytest.mark.parametrize(
    "override, message",
    [
        ("env=acrobot", "env.id: CartPole-v1 -> Acrobot-v1"),
        ("seed=2", "seed: 1 -> 2"),
        ("algo.lr=5e-4", "algo.lr: 0.001 -> 0.0005"),
        ("checkpoint.resume=false", "checkpoint.resume=false would mix the two runs"),
        (
            "algo=dqn",
            "holds a run with other settings (algo: ppo -> dqn; algo.",
        ),  # what the run is, first
    ],
)
def test_a_refused_launch_leaves_every_file_of_the_run_as_it_was(
    workdir, finished_run, override, message
):
    before = snapshot(finished_run)
    out = run_harness([*TINY, override], workdir)
    assert out.returncode != 0
    assert message in out.stdout + out.stderr
    assert snapshot(finished_run) == before


@pytest.mark.e2e
def test_a_checkpoint_holding_other_networks_is_refused_before_the_resume_changes_anything(
    workdir, finished_run
):
    """What a harness with other networks (another version) wrote: one message naming the first
    tensor that differs, at start-up, without a traceback, every file as it was."""
    newest = finished_run / "checkpoints/step-000000001024"
    state = torch.load(newest / "state.pt", weights_only=True)
    loss = state["algo"]["loss"]
    loss["value_net.0.weight"] = loss.pop("critic.0.weight")  # a network renamed
    torch.save(state, newest / "state.pt")
    meta = json.loads((newest / "meta.json").read_text())
    (newest / "meta.json").write_text(
        json.dumps({**meta, "sha256": checkpoint.sha256(newest / "state.pt")})
    )
    before = snapshot(finished_run)
    out = run_harness([*TINY, "collector.total_frames=2048"], workdir)
    said = out.stdout + out.stderr
    assert out.returncode != 0
    assert (
        f"checkpoint {newest} does not fit this run's normalizer and weights: first difference"
        in said
    ), said[-3000:]
    assert "loss.critic.0.weight" in said and "Traceback" not in said
    assert said.count("does not fit") == 1  # from one rank
    assert snapshot(finished_run) == before


@pytest.mark.unit
def test_a_run_saved_before_a_setting_existed_resumes_when_the_setting_keeps_its_default():
    saved = {
        "algo": {"name": "cql", "cql_alpha": 10.0},
        "seed": 1,
    }  # written by a harness without algo.amp
    assert (
        run_directory.differences(
            saved, {"algo": {"name": "cql", "cql_alpha": 10.0, "amp": "off"}, "seed": 1}
        )
        == []
    )
    assert run_directory.differences(
        saved, {"algo": {"name": "cql", "cql_alpha": 10.0, "amp": "bf16"}, "seed": 1}
    ) == ["algo.amp: off -> bf16"]
    # How the step runs may change on resume (an upgrade moved continuous CQL's default from true to
    # null).
    assert (
        run_directory.differences(
            {"algo": {"name": "cql", "compile": True}}, {"algo": {"name": "cql", "compile": None}}
        )
        == []
    )


@pytest.mark.e2e
def test_start_over_moves_the_earlier_run_aside_and_deletes_nothing(workdir, finished_run):
    before = snapshot(finished_run)
    out = run_harness([*TINY, "seed=2", "checkpoint.start_over=true"], workdir)
    assert out.returncode == 0, out.stderr[-3000:]
    aside = [p for p in finished_run.iterdir() if p.name.startswith("previous-")]
    kept = {k: v for k, v in before.items() if k != LOCK_NAME}  # the lock stays: this launch's
    assert len(aside) == 1 and snapshot(aside[0]) == kept
    assert (
        int(rows(finished_run)[-1]["frames"]) == 1024
        and "resumed from" not in out.stdout + out.stderr
    )


@pytest.mark.e2e
def test_flipped_bytes_inside_state_make_the_run_resume_from_the_previous_checkpoint(
    workdir, finished_run
):
    newest = finished_run / "checkpoints/step-000000001024/state.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= (
        0xFF  # one flipped byte in the middle: the file still loads, its checksum fails
    )
    newest.write_bytes(bytes(data))
    out = run_harness([*TINY, "collector.total_frames=1280"], workdir)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert (
        f"skipping checkpoint {newest.parent}" in text
        and "resumed from" in text
        and "step-000000000768" in text
    )


@pytest.mark.e2e
def test_when_every_checkpoint_is_damaged_the_launch_is_refused_listing_them(workdir, finished_run):
    for state in finished_run.glob("checkpoints/step-*/state.pt"):
        state.write_bytes(state.read_bytes()[:100])
    before = snapshot(finished_run)
    out = run_harness([*TINY, "collector.total_frames=2048"], workdir)
    assert out.returncode != 0
    assert (
        "none of the checkpoints" in out.stdout + out.stderr
        and "step-000000001024" in out.stdout + out.stderr
    )
    assert snapshot(finished_run) == before


@pytest.mark.unit
def test_no_checkpoint_is_written_from_weights_that_are_not_finite(tmp_path):
    state = {"algo": {"policy": {"net.0.weight": torch.tensor([1.0, float("nan")])}}}
    with pytest.raises(
        checkpoint.CheckpointError,
        match=r"at step 7 the training state is not finite.*net.0.weight",
    ):
        checkpoint.save(tmp_path, state, {"step": 7}, keep=2)
    assert not list(tmp_path.rglob("state.pt"))


@pytest.mark.e2e
def test_config_yaml_keeps_an_environment_interpolation_unresolved(workdir, monkeypatch):
    token = "not-a-real-token-0123456789"
    monkeypatch.setenv("HARNESS_TEST_TOKEN", token)
    out = run_harness(
        [
            "debug=tiny",
            "logger.console=false",
            "run_dir=run",
            "logger.tags=[${oc.env:HARNESS_TEST_TOKEN}]",
        ],
        workdir,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    saved = (workdir / "run" / "config.yaml").read_text()
    assert "${oc.env:HARNESS_TEST_TOKEN}" in saved and token not in saved


class LeavesAMarker:
    """Unpickling this creates ``path``: proof that code in a dataset ran."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def dataset_with_a_pickled_field(path: Path, marker: Path) -> None:
    n = 16
    data = TensorDict(
        obs=torch.zeros(n, 3),
        action=torch.zeros(n, 1),
        reward=torch.zeros(n),
        next_obs=torch.zeros(n, 3),
        terminated=torch.zeros(n, dtype=torch.bool),
        truncated=torch.zeros(n, dtype=torch.bool),
        batch_size=[n],
    )
    data.set_non_tensor("note", LeavesAMarker(marker))
    data.memmap_(str(path / "data"))
    # Written by hand, as whoever hands over such a dataset would: the harness's own writer
    # (dataset.finish) reads the fields back to digest them and would refuse the pickle first.
    meta = dataset.Meta(env="Pendulum-v1", transitions=n, episodes=0, behaviour_return=0.0)
    (path / "meta.json").write_text(json.dumps(asdict(meta)))


@pytest.mark.unit
def test_a_dataset_with_a_pickled_field_is_refused_and_its_code_never_runs(tmp_path):
    marker = tmp_path / "code-ran"
    dataset_with_a_pickled_field(tmp_path / "ds", marker)
    assert (tmp_path / "ds/data/note").is_dir()  # tensordict really stored the object, pickled
    with pytest.raises(dataset.DatasetError, match=r"not a tensor .*never unpickles"):
        dataset.load(tmp_path / "ds", "Pendulum-v1")
    with pytest.raises(
        RuntimeError, match="Refusing to load pickled"
    ):  # the second line of defence
        dataset.open_storage(tmp_path / "ds")
    assert not marker.exists()


@pytest.mark.e2e
def test_an_offline_launch_on_a_pickled_dataset_exits_naming_it_and_runs_nothing(workdir):
    marker = workdir / "code-ran"
    dataset_with_a_pickled_field(workdir / "ds", marker)
    out = run_harness(["algo=iql", "env=pendulum", "dataset=ds", "run_dir=run"], workdir)
    assert out.returncode != 0 and "which is not a tensor" in out.stderr
    assert not marker.exists() and not (workdir / "run").exists()


@pytest.mark.e2e
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["sync=shm", "sync.poll_interval_s=-1"], "sync.poll_interval_s must be >= 0"),
        (["algo=sac", "env=cartpole"], "algo=sac needs continuous actions"),
        (["+collector.total_frame=10"], "did you mean collector.total_frames?"),
        (["dist_timeout_s=-1"], "dist_timeout_s must be > 0"),
        (
            ["seed=-5"],
            "seed=-5: seeds must be >= 0",
        ),  # not a derived seed, on one rank, a minute in
        (
            ["collector.total_frames=-1"],
            "collector.total_frames=-1: the number of frames to learn from must be >= 1",
        ),
        (
            ["collector.num_envs=0"],
            "collector.num_envs=0: the number of envs per collector must be >= 1",
        ),
    ],
)
def test_a_rejected_value_stops_the_launch_before_any_rank_starts_naming_the_option(
    workdir, overrides, message
):
    out = run_harness([*overrides, "run_dir=run"], workdir, nproc=2, timeout=120)
    assert out.returncode != 0 and message in out.stderr
    assert not (workdir / "run").exists()  # refused before a run directory existed


@pytest.mark.e2e
@pytest.mark.parametrize("nproc", ["0", "-2", "three"])
def test_train_script_refuses_a_bad_rank_count_with_a_sentence(workdir, nproc):
    out = subprocess.run(
        ["bash", str(ROOT / "scripts/train.sh")],
        cwd=workdir,
        env={**os.environ, "NPROC": nproc},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        out.returncode == 2
        and f"NPROC={nproc}: the number of ranks" in out.stderr
        and "Traceback" not in out.stderr
    )


@pytest.mark.e2e
def test_a_local_sweep_gives_each_job_its_own_run_directory(workdir):
    out = run_harness(
        ["-m", "debug=tiny", "logger.console=false", "collector.total_frames=256", "seed=1,2,3"],
        workdir,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    runs = sorted(p.parent for p in workdir.glob("runs/sweep-*/*/metrics.csv"))
    # <sweep dir>/<the job's overrides>: one directory per combination
    assert [[kv for kv in p.name.split(",") if kv.startswith("seed=")] for p in runs] == [
        ["seed=1"],
        ["seed=2"],
        ["seed=3"],
    ]
    for run, seed in zip(runs, (1, 2, 3)):
        assert int(rows(run)[-1]["frames"]) == 256 and list(
            run.glob("checkpoints/step-*")
        )  # each trained on its own
        assert f"seed: {seed}" in (run / "config.yaml").read_text()
    assert "resumed from" not in out.stdout + out.stderr
