"""Collection modes, back-pressure, several trainers, evaluation, envs, seeding."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest
from helpers import CONF, column, compose_config, rows, run_harness, wait_for

from harness.collect.envs import make_vec_env
from harness.distributed.setup import init_distributed
from harness.distributed.topology import Layout
from harness.testing.spawn import run_ranks


def job(rank, world, overrides, trainer_delay_s, run_dir):
    """A real job (the harness's own trainer and collector loops) in spawned
    ranks; the trainer's update can be slowed to stress the collectors."""
    from harness.roles.collector import run_collector
    from harness.roles.trainer import Trainer

    cfg = compose_config(*overrides)
    layout = Layout.from_env(cfg.topology.trainers)
    groups = init_distributed(layout, cfg.dist_timeout_s)
    if not layout.is_trainer:
        from harness.data import channel

        sent = []
        original = channel.BatchSender.send

        def counted(self, batch, **kwargs):
            original(self, batch, **kwargs)
            sent.append(time.monotonic())

        channel.BatchSender.send = counted
        run_collector(cfg, layout, groups)
        return len(sent)
    trainer = Trainer(cfg, layout, groups, Path(run_dir))
    update = trainer.algo.update

    def slow_update(batches, frames):
        time.sleep(trainer_delay_s)
        return update(batches, frames)

    trainer.algo.update = slow_update
    trainer.run(trainer.kind.loop(layout))
    return trainer.progress.updates


@pytest.mark.multiprocess
def test_async_lag_stays_within_the_bound_with_a_slow_trainer(tmp_path):
    overrides = [
        "debug=tiny",
        "algo=dqn",  # one batch an update (async PPO takes a round's)
        "collector.mode=async",
        "collector.max_policy_lag=1",
        "logger.log_every_frames=128",
        "collector.total_frames=2048",
    ]
    results = run_ranks(job, 3, overrides, 0.05, str(tmp_path), timeout=120)
    assert all(s == "ok" for s, _ in results.values()), results
    table = rows(tmp_path)
    lags = column(table, "collect/policy_lag_max")
    assert lags and max(lags) <= 1, lags
    assert (
        sum(column(table, "collect/batches_dropped")) > 0
    )  # the bound did bite: 2 collectors, lag 2 otherwise


@pytest.mark.multiprocess
def test_slow_trainer_makes_collectors_wait_instead_of_piling_up_batches(tmp_path):
    overrides = [
        "debug=tiny",
        "algo=dqn",
        "collector.mode=async",
        "collector.max_policy_lag=100",
        "collector.total_frames=640",
    ]
    results = run_ranks(job, 3, overrides, 0.2, str(tmp_path), timeout=120)
    assert all(s == "ok" for s, _ in results.values()), results
    updates = results[0][1]
    batches = results[1][1] + results[2][1] - 2  # less each collector's final message
    # Whatever the trainer's speed, a collector is at most one batch ahead of
    # what the trainer took, plus one collected before it saw the stop: both
    # drained at shutdown. Memory stays bounded.
    assert updates == 10 and batches <= updates + 2 * 2, (updates, batches)


def dying_collector(rank, world, marker):
    # shm: the trainer never waits on a collector for weights, so the data
    # channel is what must notice the silent one.
    cfg = compose_config(
        "debug=tiny",
        "sync=shm",
        "collector.mode=async",
        "dist_timeout_s=4",
        "collector.total_frames=100000",
    )
    layout = Layout.from_env(1)
    groups = init_distributed(layout, 20)
    if rank == 2:
        from harness.data.channel import BatchSender
        from harness.roles.collector import build_collector
        from harness.sync import make_subscriber

        subscriber = make_subscriber(cfg.sync, rank, groups)
        collector = build_collector(cfg, rank, subscriber)
        BatchSender(groups.data, rank, 0, collector.batch, 4)
        wait_for(
            Path(marker).exists, 60, "the trainer to give up on this stalled collector"
        )  # connected, then silent
        return "stalled"
    if rank == 1:
        from harness.roles.collector import run_collector

        try:
            run_collector(cfg, layout, groups)
        except Exception as e:  # the trainer's failure ends this one too
            return type(e).__name__
        return "finished"
    from harness.roles.trainer import Trainer

    try:
        trainer = Trainer(cfg, layout, groups, Path(marker).parent / "run")
        trainer.run(trainer.kind.loop(layout))
    except RuntimeError as e:
        return str(e)
    finally:
        Path(marker).touch()
    return "no error"


@pytest.mark.multiprocess
def test_async_trainer_names_a_collector_that_stalled(tmp_path):
    results = run_ranks(dying_collector, 3, str(tmp_path / "trainer-gave-up"), timeout=60)
    assert "collector rank 2" in results[0][1], results[0]


@pytest.mark.e2e
def test_two_trainers_train_data_parallel(workdir):
    out = run_harness(["debug=tiny", "topology.trainers=2", "run_dir=run"], workdir, nproc=4)
    assert out.returncode == 0, out.stderr[-3000:]
    table = rows(workdir / "run")
    assert (
        int(table[-1]["frames"]) == 1024 and int(table[-1]["train/updates"]) == 8
    )  # 2 collectors x 64 a round


@pytest.mark.e2e
def test_uneven_collectors_per_trainer_is_a_layout_error(workdir):
    out = run_harness(
        ["debug=tiny", "topology.trainers=2"], workdir, nproc=3
    )  # 1 collector for 2 trainers
    assert out.returncode != 0 and "cannot feed 2 trainers equally" in out.stderr + out.stdout


@pytest.mark.e2e
def test_evaluation_runs_on_a_collector_and_the_final_one_on_the_trainer(workdir):
    out = run_harness(
        ["debug=tiny", "eval.every_frames=512", "eval.episodes=3", "run_dir=run"], workdir, nproc=3
    )
    assert out.returncode == 0, out.stderr[-3000:]
    table = rows(workdir / "run")
    evals = column(table, "eval/return")
    assert len(evals) >= 1 and all(8 <= e <= 500 for e in evals), (
        evals
    )  # CartPole returns lie in [8, 500]
    assert (
        8 <= float(table[-1]["eval/final_return"]) <= 500
    )  # the final weights, evaluated by trainer 0


@pytest.mark.unit
@pytest.mark.parametrize("env_file", sorted(p.stem for p in (CONF / "env").glob("*.yaml")))
def test_every_env_config_composes_and_steps(env_file):
    cfg = compose_config(f"env={env_file}")
    envs = make_vec_env(cfg.env.id, 2)
    obs, _ = envs.reset(seed=0)
    assert obs.shape[0] == 2
    obs, reward, _terminated, _truncated, _ = envs.step(envs.action_space.sample())
    assert obs.shape[0] == 2 and len(reward) == 2
    envs.close()


@pytest.mark.unit
def test_mujoco_env_without_the_extra_names_the_install_command(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_mujoco(name, *args, **kwargs):
        if name == "mujoco":
            raise ImportError("No module named 'mujoco'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mujoco)
    with pytest.raises(ValueError, match=r"pip install -e '\.\[mujoco\]'"):
        compose_config("env=hopper")


@pytest.mark.unit
def test_batch_statistics_count_every_episode_as_a_per_step_tally_would():
    """The collector counts episodes once per batch; a tally kept step by
    step over the batches' own frames (episodes run across batches) agrees."""
    import numpy as np

    from harness.algos.ppo import PPO, PPOConfig
    from harness.collect.envs import spec_of
    from harness.collect.rollout import RolloutCollector
    from harness.sync import Header

    envs = make_vec_env("CartPole-v1", 4)
    collector = RolloutCollector(envs, PPO.make_policy(PPOConfig(), spec_of(envs)), 4 * 24, seed=0)
    running, length = np.zeros(4), np.zeros(4, dtype=np.int64)
    for version in range(12):
        batch = collector.collect(Header(version))
        episodes = return_sum = length_sum = 0.0
        for reward, done in zip(
            batch["rollout", "reward"].numpy(), batch["rollout", "done"].numpy()
        ):
            running, length = running + reward, length + 1
            episodes, return_sum, length_sum = (
                episodes + done.sum(),
                return_sum + running[done].sum(),
                length_sum + length[done].sum(),
            )
            running[done], length[done] = 0, 0
        assert episodes > 0
        stats = batch["stats"]
        assert (
            float(stats["episodes"]),
            float(stats["return_sum"]),
            float(stats["length_sum"]),
        ) == (
            episodes,
            return_sum,
            length_sum,
        )
        assert batch["rollout", "policy_version"].eq(version).all()
    envs.close()


WALL_CLOCK = (
    "time_s",
    "collect/frames_per_s",
    "train/updates_per_s",
    "collect/idle_fraction",
    "train/idle_fraction",
    "sync/ms",
)


def timeless_rows(run_dir: Path) -> list[dict]:
    """metrics.csv's rows without the columns that time things."""
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in rows(run_dir)]


@pytest.fixture(scope="module", params=["sync", "pipelined", "pipelined-gae"])
def seeded_runs(request, tmp_path_factory) -> tuple[Path, str]:
    """1+2-rank runs of 8 rounds, a row each: ``a`` and ``b`` with seed 7 and, in sync rounds
    only (another seed changes every mode's rows alike), ``c`` with seed 8; in sync rounds, or
    pipelined ones (async collection at a fixed lag of one version: PPO corrects it with
    V-trace, or, asked to, not)."""
    where, mode = tmp_path_factory.mktemp("seeded"), request.param
    options = {
        "sync": [],
        "pipelined": ["collector.pipeline=true"],
        "pipelined-gae": ["collector.pipeline=true", "algo.vtrace=false"],
    }
    for name, seed in (("a", 7), ("b", 7), ("c", 8))[: 3 if mode == "sync" else 2]:
        args = [
            "debug=tiny",
            f"seed={seed}",
            "logger.log_every_frames=128",
            *options[mode],
            f"run_dir={name}",
        ]
        out = run_harness(args, where, nproc=3)
        assert out.returncode == 0, out.stderr[-3000:]
    return where, mode


@pytest.mark.e2e
def test_same_seed_and_layout_reproduce_the_same_rows(seeded_runs):
    """Every column but the wall-clock ones, bit for bit: losses, returns, lags, V-trace's
    truncations."""
    where, mode = seeded_runs
    assert timeless_rows(where / "a") == timeless_rows(where / "b")
    assert len(timeless_rows(where / "a")) == 8
    assert ("train/vtrace_rho_clipped" in rows(where / "a")[-1]) == (mode == "pipelined")
    if mode == "sync":  # and the rows are not the same whatever the seed
        assert [r["train/policy_loss"] for r in rows(where / "c")] != [
            r["train/policy_loss"] for r in rows(where / "a")
        ]


@pytest.mark.e2e
def test_rounds_act_with_the_newest_weights_or_one_behind_when_pipelined(seeded_runs):
    where, mode = seeded_runs
    table = rows(where / "a")
    assert column(table, "collect/policy_lag_min") == column(table, "collect/policy_lag_max")
    assert set(column(table, "collect/policy_lag_max")[1:]) == {
        0.0 if mode == "sync" else 1.0
    }  # round 0 has lag 0


@pytest.mark.e2e
@pytest.mark.slow
def test_one_and_two_trainers_learn_alike(workdir):
    """PPO on CartPole with T=1 (1+2 ranks) and T=2 (2+2 ranks): both learn."""
    finals = {}
    for trainers, nproc in ((1, 3), (2, 4)):
        out = run_harness(
            [
                "collector.total_frames=61440",
                "logger.log_every_frames=10240",
                f"topology.trainers={trainers}",
                f"run_dir=t{trainers}",
            ],
            workdir,
            nproc=nproc,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        finals[trainers] = column(rows(workdir / f"t{trainers}"), "train/episode_return")
    # PPO on CartPole swings from window to window once it learns (a 10k-frame window after a
    # peak of 395 can read 137), so the second half is judged as a whole: random play scores
    # about 22, the first window about 70.
    for trainers, curve in finals.items():
        second_half = curve[len(curve) // 2 :]
        assert statistics.mean(second_half) > 120, (trainers, curve)
        assert max(second_half) > 2 * curve[0], (trainers, curve)


@pytest.mark.unit
def test_an_evaluation_run_between_batches_rides_on_the_next_batch_once(tmp_path):
    """Sync rounds evaluate after sending a batch (while the trainer learns) and stamp the result on
    the next."""
    from harness.collect.evaluate import Evaluation, PeriodicEvaluation
    from harness.roles.collector import make_collector
    from harness.sync.contract import Header

    cfg = compose_config("debug=tiny", f"run_dir={tmp_path / 'run'}")
    collector, *_ = make_collector(cfg, 1)
    periodic = PeriodicEvaluation(
        Evaluation(cfg.env.id, cfg.env.max_episode_steps, 2, collector.policy, seed=5), every=128
    )
    assert (
        periodic.run_if_due(Header(version=1, frames=64)) == 0.0 and periodic.result is None
    )  # not due yet
    assert periodic.run_if_due(Header(version=2, frames=128)) > 0.0
    first = collector.collect(Header(version=2, frames=128))
    periodic.stamp(first)
    assert (
        float(first["stats", "eval_episodes"]) == 2
        and float(first["stats", "eval_return_sum"]) >= 2 * 8
    )
    second = collector.collect(Header(version=2, frames=128))
    periodic.stamp(second)  # already sent: not counted twice
    assert float(second["stats", "eval_episodes"]) == 0
    assert periodic.run_if_due(Header(version=3, frames=200)) == 0.0  # the next is due at 256
    collector.envs.close()
    periodic.close()
