"""A new run from another run's checkpoint, with settings of its own (``checkpoint.init_from``):
fine-tuning, a new learning rate after a plateau. Real runs through torchrun; the state checks on
real algorithms."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from helpers import compose_config, rows, run_harness, snapshot

from harness.algos import algorithm_for
from harness.collect.envs import env_spec
from harness.core import checkpoint
from harness.core.checkpoint import CheckpointMismatchError
from harness.rundir.state import initial_state

TINY = ["debug=tiny", "logger.console=false", "checkpoint.every_frames=512"]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A finished tiny run (lr 1e-3, the tuned default), whose weights moved far from their
    start."""
    where = tmp_path_factory.mktemp("source")
    out = run_harness([*TINY, "run_dir=run"], where)
    assert out.returncode == 0, out.stderr[-3000:]
    return where / "run"


def newest(run: Path) -> tuple[dict, dict]:
    return checkpoint.read(sorted(checkpoint.checkpoint_dir(run).glob("step-*"))[-1])


def actor_weights(state: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state["algo"]["loss"].items() if k.startswith("actor.")}


@pytest.mark.e2e
def test_a_new_run_starts_from_the_checkpoints_weights_with_its_own_lr_and_counters_at_zero(
    workdir, source
):
    args = [
        *TINY,
        "run_name=tuned",
        f"checkpoint.init_from={source}",
        "algo.lr=1e-12",
    ]  # a learning rate that moves nothing
    out = run_harness(args, workdir, nproc=3)
    said = out.stdout + out.stderr
    assert out.returncode == 0, said[-3000:]
    assert (
        f"initialised from {source.resolve()}/checkpoints/step-000000001024 (algo=ppo "
        f"env=CartPole-v1 at frames 1024)" in said
    )
    run = workdir / "runs" / "tuned"
    assert (
        f"init_from: {source}" in (run / "config.yaml").read_text()
    )  # where it started, kept with the run
    assert [int(r["frames"]) for r in rows(run)] == [
        256,
        512,
        768,
        1024,
    ]  # its own counters, from 0
    (state, meta), (given, _) = newest(run), newest(source)
    assert (
        meta["frames"] == 1024 and meta["version"] == 8
    )  # 8 updates of 128 frames: its own, not 1024 more
    for key, weight in actor_weights(
        state
    ).items():  # the source's weights, barely moved at lr 1e-12
        assert torch.allclose(weight, actor_weights(given)[key], atol=1e-7), key
    adam = state["algo"]["optimizer"]
    assert adam["param_groups"][0]["lr"] <= 1e-12  # this run's lr, not the source's 1e-3
    assert (
        int(adam["state"][0]["step"]) == 8 * 10
    )  # a new optimiser: its 8 updates of 10 epochs only
    again = run_harness(
        args, workdir, nproc=3
    )  # the same command: the run continues, it does not start again
    said = again.stdout + again.stderr
    assert (
        again.returncode == 0
        and f"resumed from {run.resolve()}/checkpoints/step-000000001024" in said
    ), said[-3000:]
    assert "initialised from" not in said


@pytest.mark.e2e
def test_the_optimizer_comes_along_when_asked_and_keeps_this_runs_lr(workdir, source):
    out = run_harness(
        [
            *TINY,
            "run_dir=run",
            f"checkpoint.init_from={source}",
            "checkpoint.init_with=[normalizer,optimizer]",
            "algo.lr=1e-12",
        ],
        workdir,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (state, meta), (given, _) = newest(workdir / "run"), newest(source)
    adam, before = state["algo"]["optimizer"], given["algo"]["optimizer"]
    assert (
        int(adam["state"][0]["step"]) == int(before["state"][0]["step"]) + meta["updates"] * 10
    )  # Adam's count goes on
    assert adam["param_groups"][0]["lr"] <= 1e-12


@pytest.mark.e2e
def test_init_from_on_a_directory_that_holds_another_run_is_refused_and_changes_nothing(
    workdir, source
):
    first = run_harness([*TINY, "run_dir=run"], workdir)
    assert first.returncode == 0, first.stderr[-3000:]
    before = snapshot(workdir / "run")
    out = run_harness([*TINY, "run_dir=run", f"checkpoint.init_from={source}"], workdir)
    said = out.stdout + out.stderr
    assert out.returncode != 0 and f"checkpoint.init_from: None -> {source}" in said, said[-3000:]
    assert "checkpoint.init_from starts a new run" in said and "another run_name=" in said
    assert snapshot(workdir / "run") == before


@pytest.mark.e2e
def test_a_checkpoint_of_other_networks_is_refused_naming_the_first_differing_tensor(
    workdir, source
):
    out = run_harness(
        [*TINY, "run_dir=run", "env=acrobot", f"checkpoint.init_from={source}"], workdir
    )
    said = out.stdout + out.stderr
    assert out.returncode == 2 and "Traceback" not in said, said[
        -3000:
    ]  # a mistake in the command, said at start-up
    assert (
        f"checkpoint.init_from={source} does not fit this run's weights: first difference" in said
    ), said[-3000:]
    assert not (workdir / "run" / "config.yaml").exists()  # refused before anything was written
    assert (
        "here 'loss.actor.net.0.weight (64, 6) float32', there 'loss.actor.net.0.weight (64, 4) "
        "float32'" in said
    )


@pytest.mark.unit
@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["checkpoint.init_from=nowhere"],
            "checkpoint.init_from=nowhere: no checkpoint there. Name a checkpoint directory",
        ),
        (
            ["checkpoint.init_with=[optimiser]"],
            "checkpoint.init_with=['optimiser']: ['optimiser'] unknown; choose from",
        ),
    ],
)
def test_init_settings_are_checked_before_any_rank_starts(workdir, overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        compose_config(*overrides)


SOURCE = "checkpoint.init_from=src"  # where the given state comes from, as the messages name it


def algorithm(*overrides: str):
    cfg = compose_config("env=pendulum", *overrides)
    spec = env_spec(cfg.env.id)
    return algorithm_for(cfg.algo.name, spec)(cfg.algo, spec, cfg.collector.total_frames)


@pytest.mark.unit
def test_normaliser_statistics_come_with_the_weights_unless_left_out():
    given = algorithm("algo.normalize_obs=true").state_dict()
    given["obs_norm"] = {
        k: v + 1 for k, v in given["obs_norm"].items()
    }  # statistics the source run gathered
    fresh = algorithm("algo.normalize_obs=true").state_dict()
    assert torch.equal(
        initial_state(fresh, given, {"normalizer"}, SOURCE)["obs_norm"]["mean"],
        given["obs_norm"]["mean"],
    )
    assert torch.equal(
        initial_state(fresh, given, set(), SOURCE)["obs_norm"]["mean"], fresh["obs_norm"]["mean"]
    )
    plain = algorithm("algo.normalize_obs=false").state_dict()
    with pytest.raises(
        CheckpointMismatchError,
        match=r"does not fit this run's normalizer and weights: .* exists only here",
    ):
        initial_state(fresh, plain, {"normalizer"}, SOURCE)


@pytest.mark.unit
def test_a_checkpoint_of_another_algorithm_is_refused_naming_what_differs():
    with pytest.raises(
        CheckpointMismatchError,
        match=re.escape("checkpoint.init_from=src does not fit this run's weights"),
    ):
        initial_state(
            algorithm("algo=sac").state_dict(),
            algorithm("algo=ppo").state_dict(),
            {"normalizer"},
            SOURCE,
        )
