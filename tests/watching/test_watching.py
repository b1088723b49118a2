"""Watching a run: wandb (offline, resumed, broken), and the plot script."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest
from helpers import BIN, launch_env, rows, run_harness

pytestmark = pytest.mark.e2e
TINY = ["debug=tiny", "logger.console=false"]


def wandb_records(run_dir: Path) -> list:
    """The records of the newest offline wandb run in ``run_dir``, read from
    its ``.wandb`` file: a LevelDB-style record log of wandb's own protobuf
    records (wandb >= 0.19 has no Python reader; this is what `wandb sync` reads)."""
    from wandb.proto import wandb_internal_pb2

    path = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))[-1]
    data, block, pos, chunks, records = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        chunks = payload if kind in (1, 2) else chunks + payload  # full/first, then middle/last
        if kind in (1, 4):
            records.append(chunks)
    parsed = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        parsed.append(record)
    return parsed


def wandb_history(run_dir: Path) -> list[dict]:
    """History rows of the newest offline wandb run in ``run_dir``."""
    return [
        {
            item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in record.history.item
        }
        for record in wandb_records(run_dir)
        if record.WhichOneof("record_type") == "history"
    ]


def test_offline_wandb_run_holds_the_logged_metrics(workdir):
    out = run_harness(
        [*TINY, "logger=wandb", "logger.mode=offline", "run_dir=run"], workdir, nproc=3
    )
    assert out.returncode == 0, out.stderr[-3000:]
    said = out.stdout + out.stderr
    assert "wandb sync " in out.stdout and said.count("wandb sync ") == 1, said[
        -3000:
    ]  # how to upload it later: once
    history = wandb_history(workdir / "run")
    assert [row["frames"] for row in history] == [256, 512, 768, 1024]
    for key in (
        "train/episode_return",
        "train/policy_loss",
        "collect/frames_per_s",
        "train/updates_per_s",
        "sync/ms",
        "sync/bytes",
        "collect/policy_lag_max",
        "train/approx_kl",
        "train/entropy",
    ):
        assert key in history[-1], key
    assert history[-1]["sync/bytes"] > 1000
    run = next(
        r.run for r in wandb_records(workdir / "run") if r.WhichOneof("record_type") == "run"
    )
    # One group per experiment (shared by a sweep's runs), named after the run directory, tagged
    # algo, env, scheme.
    assert (
        run.display_name == "run"
        and run.run_group
        and list(run.tags)[:3] == ["ppo", "CartPole-v1", "gloo"]
    )


def test_resumed_run_continues_the_same_wandb_run(workdir):
    first = run_harness(
        [*TINY, "logger=wandb", "logger.mode=offline", "run_dir=run"], workdir, nproc=1
    )
    assert first.returncode == 0, first.stderr[-3000:]
    run_id = (workdir / "run" / "wandb_id").read_text()
    second = run_harness(
        [
            *TINY,
            "logger=wandb",
            "logger.mode=offline",
            "collector.total_frames=1536",
            "run_dir=run",
        ],
        workdir,
        nproc=1,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert (workdir / "run" / "wandb_id").read_text() == run_id
    runs = sorted((workdir / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(run_id) for r in runs)
    assert [row["frames"] for row in wandb_history(workdir / "run")] == [1280, 1536]


def test_broken_wandb_does_not_stop_training_and_never_prints_the_key(workdir):
    secret = "0123456789abcdef0123456789abcdef01234567"
    env = {"WANDB_API_KEY": secret, "WANDB_BASE_URL": "http://127.0.0.1:9"}  # nothing listens there
    out = run_harness(
        [*TINY, "logger=wandb", "logger.mode=online", "logger.init_timeout_s=5", "run_dir=run"],
        workdir,
        nproc=1,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert text.count("training goes on, logging to metrics.csv only") == 1
    assert secret not in text and secret not in "".join(
        p.read_text(errors="ignore")
        for p in (workdir / "run").rglob("*")
        if p.is_file() and p.suffix in (".log", ".yaml", ".csv", ".json", "")
    )
    assert rows(workdir / "run")[-1]["frames"] == "1024"


def test_plot_script_draws_learning_curves_and_benchmarks(workdir):
    for seed in (1, 2):
        out = run_harness([*TINY, f"seed={seed}", f"run_dir=seed{seed}"], workdir, nproc=1)
        assert out.returncode == 0, out.stderr[-3000:]

    def plot(*args: str) -> None:
        done = subprocess.run(
            [str(BIN / "harness"), "plot", *args],
            cwd=workdir,
            env=launch_env(),
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr

    plot("seed1", "seed2", "--out", "curves.png")
    png = (workdir / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    for seed in (
        1,
        2,
    ):  # harness results sota's layout: <root>/<preset>/seed-<n>, one PNG per preset
        (workdir / "sota" / "tiny").mkdir(parents=True, exist_ok=True)
        (workdir / "sota" / "tiny" / f"seed-{seed}").symlink_to(workdir / f"seed{seed}")
    plot("--presets", "sota", "--out-dir", "plots")  # a folder not made yet
    assert (workdir / "plots" / "curves-tiny.png").read_bytes()[:4] == b"\x89PNG"
    bench = [
        {"scheme": s, "params": p, "tensors": 100, "median_ms": m * p / 1e5, "p90_ms": 1}
        for s, m in (("memcpy", 0.01), ("shm", 0.3))
        for p in (100_000, 1_000_000)
    ]
    (workdir / "bench.json").write_text(json.dumps(bench))
    plot("--bench", "bench.json", "--out", "bench.png")
    assert (workdir / "bench.png").read_bytes()[:4] == b"\x89PNG"
