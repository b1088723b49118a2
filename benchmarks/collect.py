"""Env frames per second of one collector rank, against a bare loop.

    python benchmarks/collect.py --json bench-collect.json

For CartPole-v1 and HalfCheetah-v5 (8 envs, the default PPO MLP policy), and Breakout on
``env.backend=envpool`` (8 envs, PPO's Nature CNN; ``envpool/Breakout-v5`` in envpool's synchronous
mode, ``envpool-async/Breakout-v5`` in its asynchronous mode, 4 envs a step; the envpool extra):

- ``bare/<env>``: the limit: gymnasium ``SyncVectorEnv`` (envpool: ``envpool.make`` with
  CleanRL's arguments, on the collector's threads, stepped with ``step``, or with ``recv`` and
  ``send`` as Cleanba steps it) and the same policy's forward pass, no harness;
- ``collector/<env>``: a real collector rank (``run_collector``, async mode,
  polling for weights before every step, sending packed batches over the data
  channel) feeding a trainer rank that discards every batch.

The collector rank's process runs the bare loop just before and just after
its collector, so that the reference is measured next to it on a machine
whose load drifts; ``vs_bare`` is the median over ``--repeats`` launches of
collector / mean(bare before, bare after), in frames per wall-clock second,
and ``vs_bare_cpu`` the same in frames per CPU second of the collector's
process (its helper threads included), which other processes' load on a
shared machine disturbs far less.

Then end to end, PPO on CartPole-v1 through ``torchrun`` with 1 and 2 collectors
(``e2e/1_collector``, ``e2e/2_collectors``), frames learned per second as the run logs it (median of
its rows; 2 cores here, so 2 collectors and a trainer share them). Rows: ``{"case",
"frames_per_s"}`` (bare and collector: and ``frames_per_cpu_s``; collector: and ``vs_bare``,
``vs_bare_cpu``)."""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
from hydra import compose, initialize_config_dir

from harness.algos.ppo import PPO, PPOConfig
from harness.collect.envs import make_vec_env, spec_of, to_tensor
from harness.config import load, register_configs
from harness.data.channel import BatchReceiver
from harness.distributed.setup import init_distributed
from harness.distributed.topology import Layout
from harness.sync import Header, make_publisher
from harness.testing.spawn import run_ranks

ROOT = Path(__file__).resolve().parents[1]
# case -> the env's overrides
ENVS = {
    "CartPole-v1": ["env=cartpole"],
    "HalfCheetah-v5": ["env=halfcheetah"],
    "envpool/Breakout-v5": ["env=breakout", "env.backend=envpool"],
    "envpool-async/Breakout-v5": [
        "env=breakout",
        "env.backend=envpool",
        "env.envpool.batch_size=4",
    ],
}
NUM_ENVS, STEPS = 8, 64


def config(env_case: str):
    register_configs()
    with initialize_config_dir(version_base=None, config_dir=str(ROOT / "conf")):
        return load(
            compose(
                "config",
                overrides=[
                    *ENVS[env_case],
                    "collector.mode=async",
                    f"collector.num_envs={NUM_ENVS}",
                    f"collector.frames_per_batch={NUM_ENVS * STEPS}",
                    "collector.max_policy_lag=1000000",
                ],
            )
        )


@torch.no_grad()
def bare(env_id: str, frames: int) -> tuple[float, float]:
    """Frames per second of wall-clock time, and per second of this process's CPU time."""
    if env_id.startswith("envpool"):
        return bare_envpool(env_id, frames)
    envs = make_vec_env(env_id, NUM_ENVS)
    policy = PPO.make_policy(PPOConfig(), spec_of(envs))
    obs, _ = envs.reset(seed=0)
    space = envs.single_action_space
    low_high = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(frames // NUM_ENVS):
        action = policy(to_tensor(obs))["action"].numpy()
        if low_high is not None:
            action = np.clip(action, *low_high)
        obs, *_ = envs.step(action)
    return frames / (time.perf_counter() - start), frames / (time.process_time() - cpu)


@torch.no_grad()
def bare_envpool(case: str, frames: int) -> tuple[float, float]:
    """envpool called directly as CleanRL's ``ppo_atari_envpool.py`` makes it, on this process's
    threads, and the Nature CNN's forward: ``step`` (synchronous), or ``recv``/``send`` of
    ``batch_size`` envs (asynchronous)."""
    import envpool

    cfg = config(case)
    policy = PPO.make_policy(PPOConfig(), cfg.env.spec())
    batch_size = cfg.env.envpool.batch_size or NUM_ENVS
    envs = envpool.make(
        "Breakout-v5",
        env_type="gymnasium",
        num_envs=NUM_ENVS,
        batch_size=batch_size,
        num_threads=torch.get_num_threads(),
        episodic_life=True,
        reward_clip=True,
        seed=0,
    )
    synchronous = batch_size == NUM_ENVS
    if synchronous:
        obs, _ = envs.reset()
    else:
        envs.async_reset()
    policy(torch.zeros(batch_size, *cfg.env.spec().obs_shape, dtype=torch.uint8))  # warm
    start, cpu = time.perf_counter(), time.process_time()
    if synchronous:
        for _ in range(frames // NUM_ENVS):
            obs, *_ = envs.step(policy(torch.from_numpy(obs))["action"].numpy())
    else:
        for _ in range(frames // batch_size):
            obs, *_, info = envs.recv()
            envs.send(policy(torch.from_numpy(obs))["action"].numpy(), info["env_id"])
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    envs.close()
    return frames / wall, frames / cpu


def collector_job(
    rank: int, world: int, env_id: str, batches: int
) -> list[tuple[float, float]] | None:
    """Rank 1 runs the bare loop, then a real collector, then the bare loop
    again, in one process: the reference is measured next to the collector.
    Each: (frames per wall-clock second, frames per CPU second of the process)."""
    torch.set_num_threads(1)
    cfg = config(env_id)
    layout = Layout.from_env(1)
    groups = init_distributed(layout, 60)
    if rank == 1:
        from harness.data import channel
        from harness.roles.collector import run_collector

        sent = []  # the clocks at each batch handed over, past the first (start-up)
        send = channel.BatchSender.send

        def timed_send(*args: Any, **kwargs: Any) -> None:
            send(*args, **kwargs)
            sent.append((time.perf_counter(), time.process_time()))

        channel.BatchSender.send = timed_send  # type: ignore[method-assign]  # the clock on each send, in this process only
        before = bare(env_id, batches * NUM_ENVS * STEPS)
        run_collector(cfg, layout, groups)
        (wall, cpu), (wall_end, cpu_end) = sent[0], sent[-1]
        frames = (len(sent) - 1) * NUM_ENVS * STEPS
        return [
            before,
            (frames / (wall_end - wall), frames / (cpu_end - cpu)),
            bare(env_id, batches * NUM_ENVS * STEPS),
        ]
    spec = cfg.env.spec()
    policy = PPO.make_policy(cfg.algo, spec)
    publisher = make_publisher(cfg.sync, 0, groups)
    publisher.connect({"policy": policy})
    from harness.collect.rollout import batch_template

    receiver = BatchReceiver(
        groups.data,
        0,
        [1],
        batch_template(policy, spec.obs_shape, STEPS, NUM_ENVS, obs_dtype=spec.obs_dtype),
        60,
    )
    publisher.publish(Header(0))
    for _ in range(batches + 1):  # the first batch includes start-up
        receiver.receive_any()
    publisher.publish(Header(1, stop=True))
    receiver.drain()
    publisher.close()
    return None


def end_to_end(collectors: int, frames: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            str(Path(sys.executable).parent / "torchrun"),
            "--standalone",
            f"--nproc_per_node={collectors + 1}",
            "-m",
            "harness.train",
            f"collector.total_frames={frames}",
            "logger.log_every_frames=5120",
            "logger.console=false",
            f"run_dir={tmp}/run",
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        subprocess.run(cmd, cwd=tmp, env=env, check=True, capture_output=True)
        with open(f"{tmp}/run/metrics.csv") as f:
            rows = list(csv.DictReader(f))
        return statistics.median(float(r["collect/frames_per_s"]) for r in rows[1:])


def collector_rows(env_id: str, frames: int, repeats: int) -> list[dict]:
    """``bare/<env>`` and ``collector/<env>``: medians over ``repeats`` launches of frames per
    second, wall and CPU, and the collector's ratio to the bare env around it."""
    # per launch: (bare before, collector, bare after), each (wall fps, cpu fps)
    runs: list[list[tuple[float, float]]] = []
    # bare, collector, bare in one process: drift on a noisy machine hits both alike
    for _ in range(repeats):
        result = run_ranks(collector_job, 2, env_id, frames // (NUM_ENVS * STEPS), timeout=600)
        if {status for status, _ in result.values()} != {"ok"}:
            raise RuntimeError(result)
        runs.append(cast(list[tuple[float, float]], result[1][1]))
    ratio = {
        clock: statistics.median(
            c[clock] / statistics.mean((b[clock], a[clock])) for b, c, a in runs
        )
        for clock in (0, 1)
    }
    rows = [
        {
            "case": f"bare/{env_id}",
            "frames_per_s": statistics.median(x[0] for b, _, a in runs for x in (b, a)),
            "frames_per_cpu_s": statistics.median(x[1] for b, _, a in runs for x in (b, a)),
        },
        {
            "case": f"collector/{env_id}",
            "frames_per_s": statistics.median(c[0] for _, c, _ in runs),
            "frames_per_cpu_s": statistics.median(c[1] for _, c, _ in runs),
            "vs_bare": ratio[0],
            "vs_bare_cpu": ratio[1],
        },
    ]
    print(
        f"{env_id:>16}: bare {rows[-2]['frames_per_s']:9,.0f} fps   collector "
        f"{rows[-1]['frames_per_s']:9,.0f} fps   ratio {ratio[0]:.2f} (per CPU second: "
        f"{ratio[1]:.2f}; medians of {repeats} launches)",
        flush=True,
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--frames", type=int, default=20_480, help="frames per measurement")
    parser.add_argument(
        "--repeats", type=int, default=7, help="bare/collector/bare runs; medians reported"
    )
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--no-e2e", action="store_true", help="skip the end-to-end PPO runs")
    args = parser.parse_args()
    rows = []
    for env_id in args.envs:
        try:
            config(env_id)  # the env's extra is installed
        except ValueError as e:
            print(f"skipping {env_id}: {e}")
            continue
        rows += collector_rows(env_id, args.frames, args.repeats)
    for collectors in () if args.no_e2e else (1, 2):
        fps = end_to_end(collectors, 102_400)
        rows.append(
            {
                "case": f"e2e/{collectors}_collector{'s' if collectors > 1 else ''}",
                "frames_per_s": fps,
            }
        )
        print(
            f"end to end, PPO CartPole-v1, {collectors} collector(s): {fps:,.0f} frames/s",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
