"""``harness plot``'s learning curves of several runs: groups by config, seeds counted by value,
each run to its own end, the aggregate only where every run of a group has data, true axis labels,
and a legend that covers no point."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
from helpers import BIN, ROOT
from omegaconf import OmegaConf

from harness.plot import figures
from harness.plot.curves import aggregate, group_runs, load_run

pytestmark = pytest.mark.unit
CONFIG = (
    ROOT / "docs" / "metrics" / "td3_hopper" / "seed-1" / "config.yaml"
)  # a config.yaml the harness wrote


def fake_run(run_dir, returns, seed=1, step="frames", every=1000, **overrides):
    """A run directory as the harness writes it: its config.yaml (the kept td3_hopper run's, with
    ``seed``, its own run_dir and logger.name, and ``overrides`` as "algo.learning_rate" keys), and
    a metrics row every ``every`` steps with the training return (offline: only evaluations)."""
    cfg = OmegaConf.load(CONFIG)
    cfg.seed, cfg.run_dir, cfg.logger.name = seed, str(run_dir), run_dir.name
    for key, value in overrides.items():
        OmegaConf.update(cfg, key.replace("__", "."), value)
    run_dir.mkdir(parents=True)
    OmegaConf.save(cfg, run_dir / "config.yaml")
    offline = step == "gradient_steps"
    lines = [f"{step},time_s,{'eval/return' if offline else 'train/episode_return,eval/return'}"]
    for i, r in enumerate(returns):
        evaluated = (
            "" if i % 2 else str(r + 5)
        )  # an evaluation every other row, as eval.every_frames makes
        lines.append(
            f"{every * (i + 1)},{2.0 * (i + 1)},{evaluated if offline else f'{r},{evaluated}'}"
        )
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")
    return run_dir


def test_two_runs_of_one_seed_are_two_runs_not_two_seeds(tmp_path):
    same = [
        fake_run(tmp_path / name, [1, 2, 3], seed=1) for name in ("ppo-a", "ppo-b")
    ]  # the quickstart's case
    other = fake_run(tmp_path / "ppo-c", [1, 2, 3], seed=2)
    groups = figures.plot_runs(same, tmp_path / "same.png")
    assert [g.legend for g in groups] == ["td3 Hopper-v5 (2 runs, seed 1)"]
    assert [g.legend for g in group_runs([load_run(d) for d in [same[0], other]])] == [
        "td3 Hopper-v5 (2 seeds: 1, 2)"
    ]
    mixed = group_runs([load_run(d) for d in [*same, other]])
    assert [g.legend for g in mixed] == ["td3 Hopper-v5 (3 runs, 2 seeds: 1 (2 runs), 2)"]
    assert (tmp_path / "same.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_groups_are_configs_but_for_seed_and_names_labelled_by_what_differs(tmp_path):
    runs = [
        fake_run(tmp_path / "a1", [1, 2], seed=1),
        fake_run(tmp_path / "b1", [1, 2], seed=1, algo__learning_rate=0.001),
        fake_run(tmp_path / "a2", [1, 2], seed=2, runs_root="elsewhere", logger__group="sweep"),
        fake_run(tmp_path / "b2", [1, 2], seed=3, algo__learning_rate=0.001),
    ]
    groups = group_runs([load_run(d) for d in runs])
    assert [(g.label, [r.path.name for r in g.runs]) for g in groups] == [
        ("algo.learning_rate=0.0003", ["a1", "a2"]),
        ("algo.learning_rate=0.001", ["b1", "b2"]),
    ]
    assert [g.legend for g in groups] == [
        "algo.learning_rate=0.0003 (2 seeds: 1, 2)",
        "algo.learning_rate=0.001 (2 seeds: 1, 3)",
    ]
    # Another algorithm is named by its name, not by every hyper-parameter the two do not share.
    iql = fake_run(
        tmp_path / "iql",
        [1, 2],
        step="gradient_steps",
        algo={"name": "iql", "expectile": 0.7},
        dataset="d",
    )
    labels = [g.label for g in group_runs([load_run(d) for d in [runs[0], runs[1], iql]])]
    assert labels == [
        "td3 algo.learning_rate=0.0003 dataset=null",
        "td3 algo.learning_rate=0.001 dataset=null",
        "iql dataset=d",
    ]


def test_each_run_to_its_end_and_the_aggregate_where_all_have_data(tmp_path):
    long = fake_run(
        tmp_path / "long", [10, 20, 30, 40, 50], seed=1
    )  # finished: frames 1,000 to 5,000
    short = fake_run(tmp_path / "short", [30, 40, 50], seed=2)  # stopped at 3,000
    (group,) = group_runs([load_run(long), load_run(short)])
    _, drawn = figures.draw([group])
    step_panel, time_panel = drawn[0]
    assert [(x.min(), x.max()) for x, _ in step_panel.runs] == [(1000, 5000), (1000, 3000)]
    curve = step_panel.aggregate
    assert (curve.x.min(), curve.x.max()) == (1000, 3000)
    np.testing.assert_allclose(
        curve.center, np.interp(curve.x, [1000, 3000], [20, 40])
    )  # (10+30)/2 .. (30+50)/2
    np.testing.assert_allclose(
        curve.high - curve.center, 10.0
    )  # standard error of two runs 20 apart
    assert time_panel.aggregate.x.max() == 6.0 and max(x.max() for x, _ in time_panel.runs) == 10.0
    assert sorted(x.tolist() for x, _ in step_panel.evals) == [
        [1000, 3000],
        [1000, 3000, 5000],
    ]  # every other row


def test_iqm_drops_the_outer_quarters_and_mean_does_not():
    x = np.array([0.0, 10.0])
    series = [(x, np.full(2, v)) for v in (0.0, 10.0, 20.0, 1000.0)]
    mean, iqm = aggregate(series, "mean"), aggregate(series, "iqm")
    np.testing.assert_allclose(mean.center, 257.5)
    np.testing.assert_allclose(mean.high - mean.center, np.std([0, 10, 20, 1000], ddof=1) / 2)
    np.testing.assert_allclose(iqm.center, 15.0)  # the middle two of four
    np.testing.assert_allclose(iqm.low, 7.5)  # the band: 25th to 75th percentile
    np.testing.assert_allclose(iqm.high, 265.0)
    assert aggregate([(x, x), (np.array([20.0, 30.0]), x)]) is None  # no range that both runs cover
    with pytest.raises(ValueError, match="aggregate 'median': choose one of mean, iqm"):
        aggregate(series, "median")


def test_x_label_says_frames_online_and_gradient_steps_offline(tmp_path):
    online = group_runs([load_run(fake_run(tmp_path / "on", [1, 2]))])
    offline_dir = fake_run(
        tmp_path / "off", [1, 2, 3], step="gradient_steps", algo={"name": "iql"}, dataset="d"
    )
    offline = group_runs([load_run(offline_dir)])
    assert offline[0].y_key == "eval/return"  # an offline run logs no training return
    labels = {}
    for name, groups in (("online", online), ("offline", offline)):
        fig, _ = figures.draw(groups)
        labels[name] = (fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel())
    assert labels["online"] == ("env frames", "episode return (lines: training; dots: evaluation)")
    assert labels["offline"] == ("gradient steps (offline)", "evaluation return (lines and dots)")


def test_the_legend_covers_no_point(tmp_path):
    runs = [fake_run(tmp_path / f"s{seed}", [0, 100, 200, 300], seed=seed) for seed in (1, 2)]
    runs.append(
        fake_run(tmp_path / "lr", [300, 300, 300, 300], algo__learning_rate=0.001)
    )  # points in every corner
    fig, _ = figures.draw(group_runs([load_run(d) for d in runs]))
    fig.canvas.draw()
    (legend,) = fig.legends
    box = legend.get_window_extent()
    assert all(not box.overlaps(ax.get_window_extent()) for ax in fig.axes)


def test_command_line_forms_write_their_figures(tmp_path):
    for seed in (1, 2):
        fake_run(tmp_path / "sota" / "td3_hopper" / f"seed-{seed}", [1, 2, 3], seed=seed)

    def harness_plot(*args):
        return subprocess.run(
            [BIN / "harness", "plot", *args], cwd=tmp_path, capture_output=True, text=True
        )

    def plot(*args):
        done = harness_plot(*args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "wrote curves.png" in plot(
        "sota/td3_hopper/seed-1", "sota/td3_hopper/seed-2", "--out", "curves.png"
    )
    assert "wrote iqm.png" in plot(
        "sota/td3_hopper/seed-1", "sota/td3_hopper/seed-2", "--out", "iqm.png", "--aggregate", "iqm"
    )
    assert "curves-td3_hopper.png" in plot("--presets", "sota", "--out-dir", "plots")
    # One run: its own curves.png, as the block that ends a run says.
    assert "wrote sota/td3_hopper/seed-1/curves.png" in plot("sota/td3_hopper/seed-1")
    pngs = (
        "curves.png",
        "iqm.png",
        "plots/curves-td3_hopper.png",
        "sota/td3_hopper/seed-1/curves.png",
    )
    for png in pngs:
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "empty").mkdir()
    done = harness_plot("empty", "--out", "x.png")
    assert (done.returncode, done.stderr) == (
        2,
        "error: empty has no metrics.csv: is it a run directory?\n",
    )  # a mistake in the command: one line


def test_without_the_plot_extra_plot_says_how_to_install_it(tmp_path):
    run = fake_run(tmp_path / "run", [1, 2, 3])
    # A matplotlib that is not there, found first.
    (tmp_path / "absent" / "matplotlib").mkdir(parents=True)
    (tmp_path / "absent" / "matplotlib" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'matplotlib'\", name='matplotlib')\n"
    )
    done = subprocess.run(
        [BIN / "harness", "plot", str(run)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "absent")},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "pip install -e '.[plot]'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (run / "curves.png").exists()
