"""Datasets by a recipe (harness dataset recipe=...): the same recipe and seed write the same bytes,
and a dataset's digest catches a changed byte."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import compose_config, run_harness
from tensordict import TensorDict

from harness.cli.recipe import episode_ends
from harness.data import dataset
from harness.train import check_dataset

# pendulum_medium at a size of seconds: 100 gradient steps (learning starts at 1,000 frames),
# candidates every 500 frames
TINY = [
    "recipe=pendulum_medium",
    "recipe.train_frames=1100",
    "recipe.stop.every_frames=500",
    "recipe.stop.probe_frames=800",
    "frames=1000",
    "reference.episodes=2",
]


def write_by_recipe(args: list[str], cwd) -> dict:
    done = run_harness(args, cwd, module="harness.cli.dataset", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    out = next(a.removeprefix("out=") for a in args if a.startswith("out="))
    return json.loads((cwd / out / "meta.json").read_text())


def transitions(n: int) -> TensorDict:
    g = torch.Generator().manual_seed(0)
    return TensorDict(
        obs=torch.randn(n, 3, generator=g),
        action=torch.rand(n, 1, generator=g),
        reward=torch.randn(n, generator=g),
        next_obs=torch.randn(n, 3, generator=g),
        terminated=torch.rand(n, generator=g) < 0.1,
        truncated=torch.rand(n, generator=g) < 0.1,
        batch_size=[n],
    )


@pytest.mark.unit
def test_a_changed_byte_is_caught_by_verify_and_by_an_offline_launch(tmp_path):
    meta = dataset.Meta(env="Pendulum-v1", transitions=100, episodes=0, behaviour_return=0.0)
    dataset.save(tmp_path / "ds", transitions(100), meta)
    recorded = json.loads((tmp_path / "ds" / "meta.json").read_text())["digest"]
    assert dataset.verify(tmp_path / "ds").digest == recorded
    reward = tmp_path / "ds" / "data" / "reward.memmap"
    raw = bytearray(reward.read_bytes())
    raw[123] ^= 1
    reward.write_bytes(bytes(raw))
    with pytest.raises(dataset.DatasetError, match=r"does not hold the data its meta\.json"):
        dataset.verify(tmp_path / "ds")
    # what every rank of an offline launch checks before its process groups
    cfg = compose_config("algo=iql", "env=pendulum", f"dataset={tmp_path / 'ds'}")
    with pytest.raises(dataset.DatasetError, match=r"does not hold the data its meta\.json"):
        check_dataset(cfg)


@pytest.mark.unit
def test_the_digest_covers_each_field_in_a_fixed_order():
    data = transitions(50)
    digest = dataset.content_digest(data)
    assert dataset.content_digest(data.clone()) == digest
    assert len(digest) == 64
    swapped = data.clone()
    swapped["obs"], swapped["next_obs"] = data["next_obs"], data["obs"]
    assert dataset.content_digest(swapped) != digest
    flipped = data.clone()
    flipped["terminated"][7] = ~flipped["terminated"][7]
    assert dataset.content_digest(flipped) != digest


@pytest.mark.unit
def test_episode_ends_in_a_one_env_replay():
    # two episodes: a time limit after row 2 (row 3 starts elsewhere), a termination at row 4
    obs = torch.arange(6.0).reshape(6, 1)
    next_obs = obs + 1
    next_obs[2] = 99.0
    replay = TensorDict(
        obs=obs,
        next_obs=next_obs,
        terminated=torch.tensor([0, 0, 0, 0, 1, 0]).bool(),
        batch_size=[6],
    )
    assert episode_ends(replay, 5).tolist() == [False, False, True, False, True]
    assert episode_ends(replay, 6).tolist() == [False, False, True, False, True, False]


@pytest.mark.e2e
def test_the_same_recipe_and_seed_write_the_same_digest(workdir):
    first = write_by_recipe([*TINY, "seed=0", "out=a"], workdir)
    second = write_by_recipe([*TINY, "seed=0", "out=b"], workdir)
    assert first["digest"] == second["digest"]
    assert first["recipe"]["name"] == "pendulum_medium" and first["recipe"]["seed"] == 0
    assert first["checkpoints"]["behaviour"]["probes"]
    assert (workdir / "a-run" / "checkpoints").is_dir()  # a real run directory
    assert dataset.verify(workdir / "b").digest == first["digest"]
    # a recipe never writes over an earlier run: one of another command (here, seed) is refused
    again = run_harness(
        [*TINY, "seed=3", "out=c", "recipe.run_dir=a-run"], workdir, module="harness.cli.dataset"
    )
    assert again.returncode != 0 and "a-run exists" in again.stdout + again.stderr
    assert not (workdir / "c").exists()


@pytest.mark.e2e
def test_medium_replay_is_the_run_replay_up_to_the_stop(workdir):
    meta = write_by_recipe(
        [
            *TINY,
            "recipe.kind=medium-replay",
            "recipe.stop.target_return=-1e9",
            "recipe.stop.expert_fraction=null",
            "seed=1",
            "out=mr",
        ],
        workdir,
    )
    stop = meta["checkpoints"]["behaviour"]["frames"]
    data, _ = dataset.load(workdir / "mr")
    assert meta["transitions"] == stop == data.shape[0]
    # Pendulum's episodes end at its time limit, every 200 frames, and the data ends cut
    ends = (data["truncated"] | data["terminated"]).nonzero().flatten().tolist()
    assert ends == [*range(199, stop - 1, 200), stop - 1]
    assert meta["episodes"] == stop // 200


@pytest.mark.e2e
def test_an_early_stop_ends_the_training_and_medium_replay_takes_its_checkpoints(workdir):
    # a target every checkpoint reaches: the first one is the behaviour policy; 100k frames would
    # train for half an hour, so the run must have been stopped there
    early = [
        *TINY,
        "recipe.train_frames=100000",
        "recipe.stop.early=true",
        "recipe.stop.target_return=-1e9",
        "recipe.stop.expert_fraction=null",
        "recipe.run_dir=run",
        "seed=2",
    ]
    medium = write_by_recipe([*early, "out=m"], workdir)
    written = sorted((workdir / "run" / "checkpoints").iterdir())
    first = json.loads((written[0] / "meta.json").read_text())["frames"]  # a round after 500
    record = json.loads((workdir / "run" / "recipe-training.json").read_text())
    assert record["ended"] == f"stopped at {written[0].name}, the behaviour checkpoint"
    assert medium["checkpoints"]["behaviour"]["frames"] == first
    assert medium["checkpoints"]["expert"] is None and medium["expert_return"] is None
    assert json.loads((written[-1] / "meta.json").read_text())["frames"] < 100000

    # the same command again, as medium-replay: no training, the same behaviour checkpoint
    replay = write_by_recipe([*early, "recipe.kind=medium-replay", "out=mr"], workdir)
    assert sorted((workdir / "run" / "checkpoints").iterdir()) == written
    assert replay["checkpoints"]["behaviour"]["probes"][-1]["checkpoint"] == written[0].name
    assert replay["transitions"] == first

    # a recipe that needs the whole run (its final checkpoint is the expert) is refused
    whole = [a for a in early if a != "recipe.stop.early=true"]
    refused = run_harness(
        [*whole, "recipe.kind=medium-replay", "out=full"], workdir, module="harness.cli.dataset"
    )
    assert refused.returncode != 0
    assert "needs its final checkpoint" in refused.stdout + refused.stderr
    assert not (workdir / "full").exists()
