"""Atari collection: the bare vector env, a collector against a plain loop, bytes per frame, and the
job.

    python benchmarks/atari.py --json /tmp/atari.json

In one process, on ``--env`` (the training flavour collectors make,
harness/collect/pixels.py) with ``--envs`` envs, interleaved rounds of
``--steps`` vector steps, medians over ``--rounds``:

- ``bare``: the vector env stepped with random actions;
- ``ale_vector``: ale-py's own C++ vector env (``AtariVectorEnv``: the same
  preprocessing, done in C++ by its worker threads), stepped alike, with one
  thread and with two (this machine's cores), to decide which one collectors
  should step;
- ``loop``: the same env and the ``ppo_atari`` policy (the Nature CNN) acting
  on each observation, written as a single-file script would write it;
- ``collector``: the harness's ``RolloutCollector`` filling its batches with
  the same policy, as a collector rank does (target: >= 0.9x ``loop``).

Bytes per frame: what one frame of a batch puts on the data channel (uint8
observations), against the same batch with float32 observations.

The job (``--job-frames`` > 0): ``experiment=ppo_atari`` through torchrun with
1 and 2 collectors (4 envs each), the rows' median ``collect/frames_per_s``
(the first row left out). On a CPU the trainer's CNN updates bound it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs import run_job

ROOT = Path(__file__).resolve().parents[1]


def ale_vectors(env_id: str, envs_n: int) -> dict[int, Any]:
    """ALE's own vector env of the game with 1 and 2 threads (by thread count), reset, doing the
    preprocessing the harness's wrappers do."""
    from ale_py.vector_env import AtariVectorEnv

    game = env_id.split("Atari-")[1].split("-v")[0].lower()  # harness/Atari-Breakout-v5 -> breakout
    ale = {
        n: AtariVectorEnv(
            game,
            envs_n,
            num_threads=n,
            episodic_life=True,
            reward_clipping=True,
            use_fire_reset=True,
            noop_max=30,
        )
        for n in (1, 2)
    }
    for vector in ale.values():
        vector.reset(seed=0)
    return ale


def timed_rounds(cases: dict[str, Callable[[], None]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each case in each round, the cases interleaved within a round."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, run in cases.items():
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    return times


def in_process(env_id: str, envs_n: int, steps: int, rounds: int) -> dict[str, float]:
    import numpy as np
    import torch
    from omegaconf import OmegaConf

    from harness.algos import algorithm_for
    from harness.collect.envs import env_spec, make_vec_env, to_tensor
    from harness.collect.rollout import RolloutCollector
    from harness.sync import Header

    torch.set_num_threads(1)
    spec = env_spec(env_id)
    cls = algorithm_for("ppo", spec)
    preset = OmegaConf.load(ROOT / "conf" / "experiment" / "ppo_atari.yaml")
    policy = cls.make_policy(cls.Config(**{k: v for k, v in preset.algo.items()}), spec)
    envs = make_vec_env(env_id, envs_n)
    collector = RolloutCollector(envs, policy, steps * envs_n, seed=0)
    rng = np.random.default_rng(0)

    def bare() -> None:
        for _ in range(steps):
            envs.step(rng.integers(0, spec.num_actions, envs_n))

    ale = ale_vectors(env_id, envs_n)

    def ale_vector(threads: int) -> None:
        for _ in range(steps):
            ale[threads].step(rng.integers(0, spec.num_actions, envs_n))

    @torch.no_grad()
    def loop() -> None:
        obs, _ = envs.reset(seed=1)
        for _ in range(steps):
            action = policy.act(to_tensor(obs))["action"]
            obs, *_ = envs.step(action.numpy())

    def collect() -> None:
        collector.collect(Header(0))

    cases = {
        "bare": bare,
        "ale_vector_1_thread": lambda: ale_vector(1),
        "ale_vector_2_threads": lambda: ale_vector(2),
        "loop": loop,
        "collector": collect,
    }
    times = timed_rounds(cases, rounds)
    envs.close()
    for vector in ale.values():
        vector.close()
    row = {
        f"{name}_frames_per_s": steps * envs_n / statistics.median(t) for name, t in times.items()
    }
    row["collector_vs_loop"] = row["collector_frames_per_s"] / row["loop_frames_per_s"]
    return {**row, **bytes_per_frame(collector.batch)}


def bytes_per_frame(batch: Any) -> dict[str, float]:
    """The packed buffer the data channel sends, per frame: as it is (uint8 images), and as it
    would be with float32 observations."""
    from harness.core.packing import buffer_of

    frames = batch["rollout"].numel()
    obs_bytes = batch["rollout", "obs"].nbytes + batch["next_obs"].nbytes
    packed = buffer_of(batch).nbytes / frames
    return {
        "bytes_per_frame": packed,
        "bytes_per_frame_float32_obs": packed + 3 * obs_bytes / frames,
    }


def job(collectors: int, frames: int, env: str) -> float:
    overrides = [
        "experiment=ppo_atari",
        f"env={env}",
        f"collector.total_frames={frames}",
        f"logger.log_every_frames={frames // 5}",
    ]
    return statistics.median(
        float(r["collect/frames_per_s"]) for r in run_job(collectors + 1, overrides)
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", default="harness/Atari-Breakout-v5")
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=128, help="vector steps a round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--job-frames", type=int, default=12_288, help="frames a job runs (0: no job)"
    )
    parser.add_argument("--json", help="write the row here")
    args = parser.parse_args()
    row: dict[str, Any] = {
        "env": args.env,
        **in_process(args.env, args.envs, args.steps, args.rounds),
    }
    if args.job_frames:
        for collectors in (1, 2):
            row[f"job_{collectors}_collectors_frames_per_s"] = job(
                collectors, args.job_frames, "breakout"
            )
    for key, value in row.items():
        print(f"{key:>36}: {value:.4g}" if isinstance(value, float) else f"{key:>36}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
