"""``harness results sota``'s and ``harness results offline``'s tables, made from run directories
alone (finished or not)."""

from __future__ import annotations

import dataclasses

import pytest

from harness.cli import results
from harness.cli.results import offline_table as oc
from harness.cli.results import sota as sc
from harness.data.format import Meta

pytestmark = pytest.mark.unit


def fake_run(run_dir, returns, budget, time_s):
    """A run directory as the harness writes it: config.yaml, and a metrics row every 1,000
    frames."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(
        f"algo:\n  name: td3\ncollector:\n  mode: async\n  total_frames: {budget}\nseed: 1\n"
    )
    lines = ["frames,time_s,train/episode_return,eval/return"]
    lines += [
        f"{1000 * (i + 1)},{time_s * (i + 1) / len(returns)},{r - 50},{r}"
        for i, r in enumerate(returns)
    ]
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_summary_reads_seeds_budgets_and_runs_in_progress(tmp_path):
    root = tmp_path / "sota"
    fake_run(root / "td3_hopper" / "seed-1", [100, 1000, 1200], budget=3000, time_s=60)
    fake_run(root / "td3_hopper" / "seed-2", [100, 1400], budget=3000, time_s=30)  # still running
    runs = [sc.read_run(d) for d in sc.seed_dirs(root, "td3_hopper", None)]
    row = sc.summary_row("td3_hopper", runs)
    cells = [c.strip() for c in row.strip("|").split("|")]
    # Per seed the mean of the last two evaluations: 1100 and 750.
    assert cells[:5] == ["TD3", "Hopper-v5", "3,000", "2 (1, 2)", "925.0 ± 247.5 (eval)"]
    # Training returns up to 25% (no row by 750 frames), 50% (the 1,000-frame rows) and 100% (seed 1
    # only).
    assert cells[5] == "- / 50.0 ± 0.0 / 716.7 (1 of 2 seeds)"
    assert cells[6:9] == ["3135 ± 360 on v4 (CleanRL)", "1M", "45 s"]
    assert "below the published budget: 3,000 of 1,000,000 frames" in cells[9]
    assert (
        "training episodes (as CleanRL reports): 708.3 ± 11.8" in cells[9]
    )  # last three: 716.7 and 700
    assert "in progress or stopped: seed 2 at 2,000 of 3,000" in cells[9]


def test_final_return_counts_the_final_weights_evaluation_last():
    rows = [
        {"eval/return": "100"},
        {"eval/return": ""},
        {"eval/return": "300", "eval/final_return": "500"},
    ]
    assert sc.final_return(rows) == (
        400.0,
        "eval",
    )  # the last two: 300 (older weights), 500 (the final ones)
    assert sc.final_return(rows[:2]) == (100.0, "eval")
    trained = [{"train/episode_return": str(r), "eval/return": ""} for r in (10, 20, 30, 40)]
    assert sc.final_return(trained) == (
        30.0,
        "train",
    )  # no evaluation: the last three training returns


def test_each_preset_launches_the_processes_it_is_set_for_unless_nproc_says_otherwise(tmp_path):
    # ppo_atari's rounds are CleanRL's 8 envs as 2 collectors x 4: 1 trainer + 2 collectors.
    assert "--nproc_per_node=3" in sc.command("ppo_atari", 1, tmp_path, None, False)
    assert "--nproc_per_node=3" in sc.command("ppo_atari_pong", 1, tmp_path, None, False)
    assert "--nproc_per_node=3" in sc.command(
        "ppo_cartpole", 1, tmp_path, None, False
    )  # 2 collectors x 4 envs x 32 steps
    assert "--nproc_per_node=2" in sc.command("sac_pendulum", 1, tmp_path, None, False)
    assert "--nproc_per_node=4" in sc.command("ppo_atari", 1, tmp_path, None, False, nproc=4)


def test_each_atari_row_names_its_env_rules_and_the_figure_published_for_those_rules():
    """An ale-py row plays by SB3's wrappers' rules as a CleanRL script does on NoFrameskip-v4: its
    figure is that script's on that game's NoFrameskip-v4 (CleanRL's docs), never
    ppo_atari_envpool.py's on envpool's v5 (other rules: 211.2 ± 151.8 on Breakout)."""
    atari = {name: pub for name, pub in sc.PRESETS.items() if "atari" in name}
    assert {"ppo_atari", "dqn_atari", "ppo_atari_pong"} <= set(atari)
    for name, pub in atari.items():
        game = pub.task.split()[0]
        if "SB3 wrappers' rules" in pub.task:
            script = pub.task.rsplit("CleanRL ", 1)[1].rstrip(")")
            assert f"(CleanRL {script}, {game}NoFrameskip-v4)" in pub.score, name
        else:  # any other rules are envpool's, whose figures are for its own v5 envs
            assert "envpool" in pub.task and f"{game}-v5" in pub.score, name
    assert sc.PRESETS["ppo_atari"].score.startswith("414.7 ± 28.1 ")  # CleanRL ppo.md, 10M
    assert sc.PRESETS["dqn_atari"].score.startswith("366.9 ± 39.9 ")  # CleanRL dqn.md, 10M
    assert sc.PRESETS["ppo_atari_pong"].score.startswith("20.4 ± 0.2 ")
    assert "dqn_atari.py" in sc.PRESETS["dqn_atari"].task
    # CleanRL docs/benchmark/ppo_atari_envpool.md, 10M
    assert sc.PRESETS["ppo_atari_envpool"].score.startswith("211.2 ± 151.8 ")


def test_table_replaces_its_rows_and_keeps_the_others_and_every_section(tmp_path):
    out = tmp_path / "results.md"
    kept = (
        "| PPO | CartPole-v1 | 500,000 | 1 (1) | 492.5 (train) | 490 ± 6 (CleanRL) | 500k "
        "| 130 s | |"
    )
    offline = (
        "\n## Offline: IQL and CQL\n\n| algorithm | dataset |\n| --- | --- |\n"
        "| IQL | Pendulum-v1 medium |\n"
    )
    out.write_text(f"# Results\n\n{sc.HEADER}\n{kept}\n| TD3 | Hopper-v5 | old |\n{offline}")
    sc.write_table(out, ["| TD3 | Hopper-v5 | new |"])
    text = out.read_text()
    assert kept in text and "| TD3 | Hopper-v5 | new |" in text and "old" not in text
    assert text.endswith(offline) and text.count(sc.HEADER) == 1


def hopper_meta() -> Meta:
    """A Hopper dataset's meta whose references make a normalised score of a return / 10."""
    return Meta(
        env="Hopper-v5",
        transitions=10,
        episodes=1,
        behaviour_return=500.0,
        random_return=0.0,
        expert_return=1000.0,
    )


def offline_run(run_dir, evaluations, last_step, time_s):
    """An offline run directory: a metrics row every 1,000 gradient steps, ``evaluations`` at the
    given steps."""
    run_dir.mkdir(parents=True)
    lines = ["gradient_steps,time_s,eval/return"]
    lines += [
        f"{k},{time_s * k / last_step},{evaluations.get(k, '')}"
        for k in range(1000, last_step + 1, 1000)
    ]
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_offline_row_scores_each_run_at_the_steps_it_reached(tmp_path):
    meta = hopper_meta()
    offline_run(
        tmp_path / "s1", {2000: 100, 4000: 300, 9000: 700, 10000: 900, 11000: 800}, 11000, 110
    )
    offline_run(tmp_path / "s2", {3000: 500, 6000: 600}, 6000, 60)  # stopped before 10k
    row = oc.offline_row(
        "CQL (variant)",
        "Hopper-v5 medium",
        [tmp_path / "s1", tmp_path / "s2"],
        meta,
        (5000, 10000, 50000),
        "59.08 ± 3.77",
    )
    cells = [c.strip() for c in row.strip("|").split("|")]
    # Final: the mean of the last three evaluations per seed (800, 550); at 5k the newest
    # evaluations by then (300, 500), at 10k seed 1's alone, at 50k none.
    assert cells == [
        "CQL (variant)",
        "Hopper-v5 medium",
        "11,000",
        "2",
        "675.0 ± 176.8",
        "67.5",
        "40.0 / 90.0 / -",
        "500.0, 50.0 (above)",  # the behaviour return and its normalised score
        "85 s",
        "59.08 ± 3.77",
    ]


def test_offline_section_keeps_other_rows_and_replaces_its_own(tmp_path):
    out = tmp_path / "results.md"
    head = "\n## Offline: on X\n\n| algorithm | dataset |\n| --- | --- |\n"
    out.write_text("# Results\n" + head + "| IQL | X |\n| CQL | X |\n\n## Later\nkept\n")
    oc.replace_section(out, head + "| CQL | X | new |\n")
    oc.replace_section(out, head + "| CQL (variant) | X |\n")
    text = out.read_text()
    assert (
        "| IQL | X |\n| CQL | X | new |\n| CQL (variant) | X |\n" in text
    )  # CQL's row replaced, the others kept
    assert text.endswith("\n## Later\nkept\n") and text.count("## Offline") == 1


def test_sota_summarize_writes_the_table_from_the_run_directories_alone(tmp_path):
    root, out = tmp_path / "sota", tmp_path / "results.md"
    fake_run(root / "td3_hopper" / "seed-1", [100, 1000, 1200], budget=3000, time_s=60)
    args = ["sota", "--summarize", "--only", "td3_hopper", "--runs-root", str(root)]
    assert results.main([*args, "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# Results\n\nMade by `harness results sota` from the run directories")
    assert "\n| TD3 | Hopper-v5 | 3,000 | 1 (1) | 1,100.0 (eval) |" in text


def test_offline_section_says_how_it_was_made_and_what_its_dataset_is():
    meta = Meta(
        env="Pendulum-v1",
        transitions=50_000,
        episodes=250,
        behaviour_return=-600.0,
        random_return=-1200.0,
        expert_return=-150.0,
        sources=[{"algo": "sac", "frames": 3072}],
    )
    made_by = "Made by `harness results offline --task pendulum` on 2026-12-04 (...)."
    head = oc.section("Offline: on X", made_by, "datasets/x", meta, 10, [10_000, 50_000])
    lines = head.splitlines()
    assert lines[:4] == ["", "## Offline: on X", "", made_by]
    assert lines[4].startswith("Dataset `datasets/x`: 50,000 transitions of a SAC policy stopped")
    assert "| normalised at 10k / 50k |" in lines[-2] and lines[-1].startswith("| --- |")


def test_offline_section_names_a_recipe_datasets_recipe_checkpoint_and_digest():
    meta = dataclasses.replace(
        hopper_meta(),
        transitions=1_000_000,
        episodes=3_000,
        expert_return=None,
        digest="0123456789abcdef" * 4,
        recipe={"name": "hopper_medium", "kind": "medium", "seed": 0, "preset": "sac_hopper"},
        checkpoints={"behaviour": {"frames": 120_000}},
    )
    head = oc.section("Offline on hopper_medium seed 0", "Made by ...", "d", meta, 20, [10_000])
    said = head.splitlines()[4]
    assert said == (
        "Dataset `d`: 1,000,000 transitions, `medium` by the recipe `hopper_medium` seed 0 "
        "(sac_hopper, behaviour checkpoint at 120,000 frames); behaviour return 500.0 over 3,000 "
        "episodes, random 0.0, expert none (the recipe's references); digest `0123456789abcdef`."
    )
    assert head.splitlines()[-2].endswith("| wall time | CORL |")
