"""``evaluate``'s forward distance: on MuJoCo's locomotion tasks, how far each evaluation episode
moved (its last ``x_position`` minus its first), held against gymnasium's own env played with the
same actions; ``harness evaluate`` prints it, and a run's evaluations carry it to ``eval/distance``
in its rows (online: on a collector's batch; offline: in an evaluator's message) and to the
offline results table."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from harness.cli.results import offline_table
from harness.collect.evaluate import Evaluation, PeriodicEvaluation, evaluate, make_eval_envs
from harness.metrics.stats import EvalResult, EvalStats, RolloutStats
from harness.sync.contract import Header
from tests.watching.test_eval_sem import batch_with_stats
from tests.watching.test_results import hopper_meta, offline_run


class Push(torch.nn.Module):
    """A deterministic policy: the same action on every step (all joints at ``torque``)."""

    def __init__(self, torque: float):
        super().__init__()
        self.torque = torque

    def act(self, obs: torch.Tensor, values, deterministic: bool = False) -> TensorDict:
        action = torch.full((obs.shape[0], 3), self.torque)
        return TensorDict(action=action, batch_size=[obs.shape[0]])


class Left(torch.nn.Module):
    """CartPole's action 0 on every step."""

    def act(self, obs: torch.Tensor, values, deterministic: bool = False) -> TensorDict:
        action = torch.zeros(obs.shape[0], dtype=torch.int64)
        return TensorDict(action=action, batch_size=[obs.shape[0]])


def reference_distance(seed: int, torque: float) -> float:
    """One Hopper-v5 episode played with gymnasium alone: the last x_position minus the first."""
    env = gym.make("Hopper-v5")
    _, info = env.reset(seed=seed)
    first, done = info["x_position"], False
    while not done:
        _, _, terminated, truncated, info = env.step(np.full(3, torque, dtype=np.float32))
        done = terminated or truncated
    env.close()
    return float(info["x_position"] - first)


@pytest.mark.unit
@pytest.mark.parametrize("torque", [0.0, 0.8])
def test_each_episodes_forward_distance_is_gymnasiums_own(torque, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MuJoCo writes MUJOCO_LOG.TXT where it runs
    envs = make_eval_envs("Hopper-v5", 3, None, render=False)
    distances: list[float] = []
    try:
        evaluate(Push(torque), envs, seed=11, values={}, distances=distances)  # type: ignore[arg-type]
    finally:
        envs.close()
    # the vector env seeds its envs 11, 12, 13
    assert distances == pytest.approx([reference_distance(s, torque) for s in (11, 12, 13)])
    assert max(abs(d) for d in distances) > 1e-3  # the episodes did move the hopper


@pytest.mark.unit
def test_envs_without_a_position_give_no_distance():
    envs = make_eval_envs("CartPole-v1", 2, None, render=False)
    distances: list[float] = []
    try:
        evaluate(Left(), envs, seed=0, values={}, distances=distances)  # type: ignore[arg-type]
    finally:
        envs.close()
    assert distances == []


@pytest.mark.unit
def test_a_runs_evaluations_carry_the_distance_to_its_online_and_offline_rows(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    evaluation = Evaluation("Hopper-v5", None, 3, Push(0.8), seed=11)  # type: ignore[arg-type]
    try:
        result = evaluation(Header(4, values={}))
    finally:
        evaluation.close()
    expected = [reference_distance(s, 0.8) for s in (11, 12, 13)]
    assert (result.distance_episodes, result.distance_sum) == (3.0, pytest.approx(sum(expected)))
    # online: the result rides on a collector's batch to the trainer's row
    periodic = PeriodicEvaluation(evaluation, every=1)
    periodic.result = result
    batch = batch_with_stats()
    periodic.stamp(batch)
    online = RolloutStats()
    online.add(batch, version=4)
    assert online.row()["eval/distance"] == pytest.approx(sum(expected) / 3)
    # offline: an evaluator's message, read back by the trainer, then pooled with a CartPole-like
    # result without positions (it must not dilute the mean)
    received = EvalResult.read(4, batch["stats"])
    assert received == result
    offline = EvalStats()
    offline.add([received, EvalResult(5, 2.0, 10.0, 50.0)])
    assert offline.row()["eval/distance"] == pytest.approx(sum(expected) / 3)
    assert "eval/distance" not in EvalStats().row() and "eval/distance" not in RolloutStats().row()


@pytest.mark.unit
def test_the_offline_table_shows_how_far_the_final_evaluations_moved(tmp_path):
    def with_distances(run_dir, distances):
        metrics = run_dir / "metrics.csv"
        lines = metrics.read_text().splitlines()
        rows = [
            line + "," + (str(distances.pop(0)) if line.split(",")[2] else "") for line in lines[1:]
        ]
        metrics.write_text("\n".join([lines[0] + ",eval/distance", *rows]) + "\n")

    for seed, distances in (("s1", [0.0, 3.0, 6.0, 9.0]), ("s2", [0.0, 1.0, 2.0, 3.0])):
        offline_run(tmp_path / seed, {1000: 50, 2000: 100, 3000: 150, 4000: 200}, 4000, 40)
        with_distances(tmp_path / seed, distances)
    offline_run(tmp_path / "old", {1000: 50, 2000: 100, 3000: 150}, 3000, 30)  # logged before it

    def final(dirs):
        return offline_table.offline_row("CQL", "x", dirs, hopper_meta(), ()).split("|")[5]

    # the last three evaluations' mean per seed (6 and 2), then the mean over seeds
    assert final([tmp_path / "s1", tmp_path / "s2"]).strip().endswith(", forward 4.0")
    assert "forward" not in final([tmp_path / "s1", tmp_path / "old"])
