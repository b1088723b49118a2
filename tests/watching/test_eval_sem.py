"""eval/return_sem: the standard error of an evaluation's mean return, carried as a sum of squared
returns from the evaluating env loop through the batch's stats (online) or the evaluator's report
(offline) to the row, and into the offline results table."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from tensordict import TensorDict

from harness.cli.results import offline_table as oc
from harness.collect.envs import spec_of
from harness.collect.evaluate import Evaluation, PeriodicEvaluation, evaluate
from harness.collect.rollout import STATS
from harness.metrics.stats import EvalResult, EvalStats, RolloutStats
from harness.sync.contract import Header
from tests.toy_algo import ToyPGPolicy
from tests.watching.test_results import hopper_meta, offline_run


def sem(returns: list[float]) -> float:
    """The formula, written out: sample standard deviation (n - 1) over sqrt(n)."""
    return statistics.stdev(returns) / math.sqrt(len(returns))


def result_of(returns: list[float], version: int = 1) -> EvalResult:
    return EvalResult(version, float(len(returns)), sum(returns), sum(r * r for r in returns))


def batch_with_stats() -> TensorDict:
    stats = TensorDict({k: torch.zeros((), dtype=torch.float64) for k in STATS})
    rollout = TensorDict(policy_version=torch.zeros(2, 1, dtype=torch.int64), batch_size=[2, 1])
    return TensorDict(rollout=rollout, stats=stats)


@pytest.mark.unit
def test_an_evaluations_squared_returns_are_those_of_its_episodes():
    torch.manual_seed(0)
    evaluation = Evaluation("CartPole-v1", None, 4, policy=None, seed=3)  # type: ignore[arg-type]
    evaluation.policy = ToyPGPolicy(spec_of(evaluation.envs))
    try:
        returns = evaluate(evaluation.policy, evaluation.envs, 3, {})
        result = evaluation(Header(7, values={}))
    finally:
        evaluation.close()
    assert result == (
        7,
        4.0,
        pytest.approx(sum(returns)),
        pytest.approx(sum(r * r for r in returns)),
        0.0,  # CartPole reports no x_position: no distance
        0.0,
    )


@pytest.mark.unit
def test_online_rows_state_the_standard_error_of_the_evaluation_riding_on_a_batch():
    returns = [210.0, 180.5, 500.0, 12.0, 333.3]
    periodic = PeriodicEvaluation(evaluation=None, every=1)  # type: ignore[arg-type]
    periodic.result = result_of(returns)
    batch = batch_with_stats()
    periodic.stamp(batch)
    stats = RolloutStats()
    stats.add(batch, version=1)
    row = stats.row()
    assert row["eval/return"] == pytest.approx(statistics.mean(returns))
    assert row["eval/return_sem"] == pytest.approx(sem(returns))


@pytest.mark.unit
def test_offline_rows_state_the_standard_error_of_the_pooled_episodes_and_of_the_score():
    first, second = [1000.0, 1500.0, 700.0], [2000.0, 1200.0]
    evals = EvalStats()
    evals.add([result_of(first, 1), result_of(second, 2)])
    row = evals.row(normalize=lambda ret: 100 * (ret + 20) / (3000 + 20))
    assert row["eval/return_sem"] == pytest.approx(sem(first + second))
    assert row["eval/normalized_score_sem"] == pytest.approx(100 * sem(first + second) / 3020)


@pytest.mark.unit
def test_one_episode_has_no_standard_error_and_a_row_without_evaluations_no_column():
    evals = EvalStats()
    assert evals.row() == {}  # no evaluation since the last row
    assert "eval/return_sem" not in RolloutStats().row()
    evals.add([result_of([321.0])])
    assert math.isnan(evals.row()["eval/return_sem"])


@pytest.mark.unit
def test_the_offline_table_shows_the_final_returns_standard_error_where_the_metrics_have_it(
    tmp_path,
):
    meta = hopper_meta()
    for seed, final in (("s1", 600), ("s2", 800)):
        offline_run(tmp_path / seed, {1000: 100, 2000: 200, 3000: final}, 3000, 30)
        metrics = tmp_path / seed / "metrics.csv"
        lines = metrics.read_text().splitlines()
        # eval/return_sem 30 at each evaluation
        lines = [lines[0] + ",eval/return_sem"] + [line + ",30" for line in lines[1:]]
        metrics.write_text("\n".join(lines) + "\n")
    cells = oc.offline_row("IQL", "x", [tmp_path / "s1", tmp_path / "s2"], meta, ())
    final, normalised = [c.strip() for c in cells.strip("|").split("|")][4:6]
    # each seed's final (three evaluations): 30 * sqrt(3) / 3; their mean's: that * sqrt(2) / 2
    expected = 30 * math.sqrt(3) / 3 * math.sqrt(2) / 2
    assert final.endswith(f"(SEM {expected:.1f})")
    assert normalised.endswith(f"(SEM {expected / 10:.1f})")
