"""scripts/sota_check.py's table, made from run directories alone (finished or not)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from helpers import ROOT

pytestmark = pytest.mark.unit


def sota_check():
    spec = importlib.util.spec_from_file_location("sota_check", ROOT / "scripts" / "sota_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sota_check"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def fake_run(run_dir, returns, budget, time_s):
    """A run directory as the harness writes it: config.yaml, and a metrics row every 1,000 frames."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(f"algo:\n  name: td3\ncollector:\n  mode: async\n  total_frames: {budget}\nseed: 1\n")
    lines = ["frames,time_s,train/episode_return,eval/return"]
    lines += [f"{1000 * (i + 1)},{time_s * (i + 1) / len(returns)},{r - 50},{r}" for i, r in enumerate(returns)]
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_summary_reads_seeds_budgets_and_runs_in_progress(tmp_path):
    sc = sota_check()
    root = tmp_path / "sota"
    fake_run(root / "td3_hopper" / "seed-1", [100, 1000, 1200], budget=3000, time_s=60)
    fake_run(root / "td3_hopper" / "seed-2", [100, 1400], budget=3000, time_s=30)  # still running
    runs = [sc.read_run(d) for d in sc.seed_dirs(root, "td3_hopper", None)]
    row = sc.summary_row("td3_hopper", runs)
    cells = [c.strip() for c in row.strip("|").split("|")]
    # Per seed the mean of the last two evaluations: 1100 and 750.
    assert cells[:5] == ["TD3", "Hopper-v5", "3,000", "2 (1, 2)", "925.0 ± 247.5 (eval)"]
    assert cells[5:8] == ["3135 ± 360 on v4 (CleanRL)", "1M", "45 s"]
    assert "below the published budget: 3,000 of 1,000,000 frames" in cells[8]
    assert "training episodes (as CleanRL reports): 708.3 ± 11.8" in cells[8]  # last three: 716.7 and 700
    assert "in progress or stopped: seed 2 at 2,000 of 3,000" in cells[8]


def test_final_return_counts_the_final_weights_evaluation_last():
    sc = sota_check()
    rows = [{"eval/return": "100"}, {"eval/return": ""}, {"eval/return": "300", "eval/final_return": "500"}]
    assert sc.final_return(rows) == (400.0, "eval")  # the last two: 300 (older weights), 500 (the final ones)
    assert sc.final_return(rows[:2]) == (100.0, "eval")
    trained = [{"train/episode_return": str(r), "eval/return": ""} for r in (10, 20, 30, 40)]
    assert sc.final_return(trained) == (30.0, "train")  # no evaluation: the last three training returns


def test_table_replaces_its_rows_and_keeps_the_others_and_every_section(tmp_path):
    sc = sota_check()
    out = tmp_path / "results.md"
    kept = "| PPO | CartPole-v1 | 500,000 | 1 (1) | 492.5 (train) | 490 ± 6 (CleanRL) | 500k | 130 s | |"
    offline = "\n## Offline: IQL and CQL\n\n| algorithm | dataset |\n| --- | --- |\n| IQL | Pendulum-v1 medium |\n"
    out.write_text(f"# Results\n\n{sc.HEADER}\n{kept}\n| TD3 | Hopper-v5 | old |\n{offline}")
    sc.write_table(out, ["| TD3 | Hopper-v5 | new |"])
    text = out.read_text()
    assert kept in text and "| TD3 | Hopper-v5 | new |" in text and "old" not in text
    assert text.endswith(offline) and text.count(sc.HEADER) == 1
