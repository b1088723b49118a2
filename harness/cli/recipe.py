"""Datasets by D4RL's recipe, rebuilt from a recipe's name and a seed (``harness dataset recipe=``).

    harness dataset recipe=pendulum_medium seed=0                # datasets/pendulum-medium-seed0
    harness dataset recipe=hopper_medium_replay seed=0 out=DIR   # DIR, and its training run DIR-run

A recipe (``conf/recipe/*.yaml``, :class:`RecipeConfig`) names an experiment preset, the frames it
trains for, the spacing of its checkpoints, the stop criterion and the kind of dataset. In one
process, with one thread:

1. the preset trains through the harness's own launch (``python -m harness.train``, world size 1)
   into a new run directory, a checkpoint every ``stop.every_frames`` (or an earlier recipe's run
   of the same command is taken as it is: :class:`Training`);
2. the expert is that run's final checkpoint; its deterministic return is the expert reference,
   uniform random actions' the random one (unless ``reference.*_return`` gives them);
3. the behaviour policy is the first checkpoint whose stochastic return over ``stop.probe_frames``
   reaches the target (``stop.target_return``, or ``stop.expert_fraction`` of the way from the
   random to the expert return); with ``stop.early`` the checkpoints are probed as the run writes
   them and the run ends there, as D4RL's SAC did (the expert return must then be given);
4. the data: ``medium``, ``frames`` transitions of its stochastic actions; ``medium-replay``, the
   run's replay buffer up to that checkpoint; ``medium-expert``, medium followed by ``frames`` of
   the expert's stochastic actions;
5. ``meta.json`` records the recipe, the checkpoints, every probe, the returns and the digest.

Every step is seeded from ``seed``, so the same recipe and seed write the same bytes on the same
machine kind (docs/offline.md says what is and is not deterministic).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from harness.algos.base import Policy
from harness.cli.dataset_config import DatasetConfig, RecipeConfig, StopConfig
from harness.cli.policies import RandomPolicy, load_policy
from harness.collect.envs import env_spec, make_vec_env
from harness.collect.evaluate import eval_seed, evaluate
from harness.collect.rollout import RolloutCollector
from harness.core import checkpoint
from harness.data import dataset
from harness.data.format import FIELDS, DatasetError, Meta, episode_fields
from harness.sync.contract import Header

log = logging.getLogger("harness")
PROBE_SEED = 500_000  # the probes' envs start this far past the dataset's seed
EXPERT_SEED = 1_000_000  # and the expert's rollouts (medium-expert) this far


class Training:
    """The recipe's training run: one process, one thread, on the CPU (the same seed: the same
    checkpoints; ``recipe.overrides`` may say otherwise), a checkpoint every ``stop.every_frames``,
    all kept. ``recipe-training.json`` in its run directory records the command and how the run
    ended, so that a later recipe with the same command (``medium`` and ``medium-replay`` of one
    run) takes its checkpoints instead of training again."""

    RECORD = "recipe-training.json"

    def __init__(self, cfg: DatasetConfig, recipe: RecipeConfig, run_dir: Path) -> None:
        keep = recipe.train_frames // recipe.stop.every_frames + 2  # all of them: the candidates
        self.run_dir, self.early = run_dir, recipe.stop.early
        self.args = [
            f"experiment={recipe.preset}",
            f"seed={cfg.seed}",
            f"collector.total_frames={recipe.train_frames}",
            f"checkpoint.every_frames={recipe.stop.every_frames}",
            f"checkpoint.keep={keep}",
            f"checkpoint.replay_buffer={str(recipe.replay_buffer).lower()}",
            "trainer.device=cpu",  # a GPU's kernels need not sum in the same order each time
            "trainer.threads=1",
            "logger.console=false",
            *recipe.overrides,
        ]
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        """Train into a new run directory; one that exists is taken only if an earlier recipe ran
        the same command there to its end (or, for an early-stopping recipe, to its stop)."""
        record = self.run_dir / self.RECORD
        if self.run_dir.exists():
            earlier = json.loads(record.read_text()) if record.is_file() else {}
            if earlier.get("args") != self.args or "ended" not in earlier:
                raise DatasetError(
                    f"{self.run_dir} exists and is not a finished run of this recipe's training "
                    f"({record.name} there does not record the command {' '.join(self.args)} "
                    "run to its end): a recipe never writes over an earlier run's. Delete it, or "
                    "give recipe.run_dir=<a new path>"
                )
            if earlier["ended"] != "finished" and not self.early:
                raise DatasetError(
                    f"{self.run_dir}'s training {earlier['ended']}, but this recipe needs its "
                    "final checkpoint (the expert): give recipe.run_dir=<a new path>"
                )
            log.info("taking the checkpoints of %s (%s)", self.run_dir, earlier["ended"])
            return
        cmd = [sys.executable, "-m", "harness.train", f"run_dir={self.run_dir}", *self.args]
        log.info("training the behaviour policy: %s", " ".join(cmd[2:]))
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen(cmd, env=env)

    def checkpoints(self) -> Iterator[Path]:
        """Every checkpoint, oldest first, as the run writes it (each appears whole: written
        aside, then renamed); ends when the run does."""
        seen: set[Path] = set()
        while True:
            ended = self.process is None or self.process.poll() is not None
            for path in sorted(checkpoint.checkpoint_dir(self.run_dir).glob("step-*")):
                if path not in seen:
                    seen.add(path)
                    yield path
            if ended:
                break
            time.sleep(1.0)
        if self.process is not None:
            if self.process.returncode != 0:
                raise DatasetError(
                    f"the recipe's training run failed (exit {self.process.returncode}; its "
                    f"output above says why). {self.run_dir} is left as it is: delete it, or "
                    "give another recipe.run_dir="
                )
            self.record("finished")

    def stop(self, at: Path) -> None:
        """End the run at the behaviour checkpoint ``at`` (D4RL early-stopped its SAC there): the
        checkpoints up to it are the ones a whole run writes."""
        if self.process is None:  # an earlier recipe's run
            return
        if self.process.poll() is None:
            self.process.terminate()  # the run stops at its next safe point
            try:
                self.process.wait(timeout=300)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.record(f"stopped at {at.name}, the behaviour checkpoint")
        elif self.process.returncode == 0:  # it reached its frames while the last probe ran
            self.record("finished")

    def kill(self) -> None:
        """After an error: a run still going is ended and recorded as unfinished (none)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def record(self, ended: str) -> None:
        text = json.dumps({"args": self.args, "ended": ended}, indent=1)
        (self.run_dir / self.RECORD).write_text(text)


def roll_out(
    cfg: DatasetConfig, policy: Policy, values: dict[str, float], frames: int, seed: int
) -> tuple[TensorDict, list[float]]:
    """``frames`` transitions of ``policy``'s stochastic actions on ``cfg.num_envs`` envs seeded
    from ``seed``; with the returns of the episodes that ended in them."""
    envs = make_vec_env(cfg.env.id, cfg.num_envs, cfg.env.max_episode_steps)
    torch.manual_seed(seed)  # the actions' samples
    steps = max(1, min(1000, frames // cfg.num_envs))
    collector = RolloutCollector(envs, policy, steps * cfg.num_envs, seed, next_obs=True)
    header = Header(version=0, frames=0, stop=False, values=values)
    parts, held, returns = [], 0, []
    try:
        while held < frames:
            batch = collector.collect(header)
            rows = batch["rollout"].select(*FIELDS).reshape(-1)[: frames - held]
            parts.append(rows.clone())
            held += rows.shape[0]
            returns += [r for row, r in collector.ended_returns if row < rows.shape[0]]
    finally:
        envs.close()
    return TensorDict.cat(parts), returns


def deterministic_return(cfg: DatasetConfig, policy: Policy, values: dict[str, float]) -> float:
    """A reference return: ``reference.episodes`` deterministic episodes from fixed seeds."""
    torch.manual_seed(cfg.seed)  # uniform random actions draw from torch's generator
    episodes = cfg.reference.episodes
    envs = make_vec_env(cfg.env.id, episodes, cfg.env.max_episode_steps, training=False)
    try:
        return float(np.mean(evaluate(policy, envs, eval_seed(cfg.seed, 0, episodes), values)))
    finally:
        envs.close()


def behaviour(
    cfg: DatasetConfig, candidates: Iterable[Path], target: float
) -> tuple[Path, list[dict]]:
    """The first candidate whose stochastic return reaches ``target``, and every probe made."""
    probes: list[dict] = []
    assert cfg.recipe is not None
    for path in candidates:
        policy, values, source = load_policy(str(path), cfg.env.id)
        frames = cfg.recipe.stop.probe_frames
        _, returns = roll_out(cfg, policy, values, frames, cfg.seed + PROBE_SEED)
        if not returns:
            raise DatasetError(
                f"probing {path}: no episode ended in {frames} frames; raise "
                "recipe.stop.probe_frames above an episode's length"
            )
        probes.append({"checkpoint": path.name, "frames": source["frames"]})
        probes[-1]["return"] = float(np.mean(returns))
        log.info("probe %s: stochastic return %.1f", path.name, probes[-1]["return"])
        if probes[-1]["return"] >= target:
            return path, probes
    raise DatasetError(
        f"no checkpoint of the recipe's run reached the target return {target:.1f} (probes: "
        + ", ".join(f"{p['frames']}: {p['return']:.1f}" for p in probes)
        + "): lower the recipe's stop criterion or raise recipe.train_frames"
    )


def episode_ends(replay: TensorDict, n: int) -> torch.Tensor:
    """Where the first ``n`` transitions of a one-env replay end an episode: terminated, or
    the next row starts elsewhere than this row's next_obs (a reset: the time limit)."""
    obs, next_obs = replay["obs"], replay["next_obs"]
    ends = replay["terminated"][:n].clone()
    later = min(n, replay.shape[0] - 1)  # rows whose successor is in the replay
    moved = (obs[1 : later + 1] != next_obs[:later]).reshape(later, -1).any(-1)
    ends[:later] |= moved
    return ends


def replay_until(chosen: Path, run_dir: Path) -> tuple[TensorDict, list[float]]:
    """medium-replay: the run's replay up to the behaviour checkpoint ``chosen`` (every frame
    of it, as that checkpoint keeps it), with ``truncated`` where an episode hit its time limit
    or the data ends; the returns of the episodes that ended in them."""
    run_cfg = OmegaConf.load(run_dir / "config.yaml")
    if run_cfg.collector.num_envs != 1:
        raise DatasetError(
            "medium-replay reads episode ends from the replay's order, which needs one env: "
            "give the recipe collector.num_envs=1 (async off-policy presets have it)"
        )
    state, meta = checkpoint.read(chosen)
    replay = state.get("replay")
    if not isinstance(replay, dict) or replay["size"] != meta["frames"]:
        raise DatasetError(
            f"{chosen} does not keep every frame of the run in its replay buffer: give the "
            "recipe algo.buffer_size >= recipe.train_frames"
        )
    frames = meta["frames"]
    stored = TensorDict(replay["storage"], batch_size=[replay["size"]])
    ends = episode_ends(stored, frames)
    data = stored[:frames].clone()
    data["truncated"] = ends & ~data["terminated"]
    data["truncated"][-1] |= ~data["terminated"][-1]  # the data ends: the episode is cut there
    done = ends.nonzero().flatten()
    sums = data["reward"].double().cumsum(0)[done]
    returns = sums - torch.cat([sums.new_zeros(1), sums[:-1]])
    return data.select(*FIELDS), returns.tolist()


def target_return(stop: StopConfig, random_return: float, expert_return: float) -> float:
    if stop.target_return is not None:
        return stop.target_return
    assert stop.expert_fraction is not None  # RecipeConfig checked that one is given
    return random_return + stop.expert_fraction * (expert_return - random_return)


def write(cfg: DatasetConfig) -> Meta:
    """Train, choose, roll out and write ``cfg.out`` as ``cfg.recipe`` says (module docstring)."""
    recipe = cfg.recipe
    assert recipe is not None
    out = Path(cfg.out)
    dataset.refuse_existing(out)
    torch.set_num_threads(1)  # the rollouts' and probes' networks: the same sums on every run
    training = Training(cfg, recipe, Path(recipe.run_dir or f"{cfg.out}-run"))
    training.start()
    try:
        return write_from(cfg, training)
    finally:
        training.kill()


def write_from(cfg: DatasetConfig, training: Training) -> Meta:
    recipe, ref = cfg.recipe, cfg.reference
    assert recipe is not None
    random_return = ref.random_return
    if random_return is None:
        random_return = deterministic_return(cfg, RandomPolicy(env_spec(cfg.env.id)), {})
    expert_source = None
    if recipe.stop.early:  # the target is known before training (DatasetConfig checked)
        target = target_return(recipe.stop, random_return, ref.expert_return or 0.0)
        chosen, probes = behaviour(cfg, training.checkpoints(), target)
        training.stop(at=chosen)
        expert_return = ref.expert_return
    else:
        candidates = list(training.checkpoints())  # the whole run: its last is the expert
        expert, expert_values, expert_source = load_policy(str(candidates[-1]), cfg.env.id)
        expert_return = ref.expert_return
        if expert_return is None:
            expert_return = deterministic_return(cfg, expert, expert_values)
        target = target_return(recipe.stop, random_return, expert_return)
        chosen, probes = behaviour(cfg, candidates, target)
    policy, values, source = load_policy(str(chosen), cfg.env.id)
    sources = [{**source, "seed": cfg.seed}]
    if recipe.kind == "medium-replay":
        data, returns = replay_until(chosen, training.run_dir)
        sources = [{"replay": str(chosen), "frames": source["frames"]}]
    else:
        data, returns = roll_out(cfg, policy, values, cfg.frames, cfg.seed)
    if recipe.kind == "medium-expert":  # never early (RecipeConfig): the expert was loaded
        assert expert_source is not None
        seed = cfg.seed + EXPERT_SEED
        more, more_returns = roll_out(cfg, expert, expert_values, cfg.frames, seed)
        data = TensorDict.cat([data, more])
        returns += more_returns
        sources.append({**expert_source, "seed": seed})
    meta = Meta(
        env=cfg.env.id,
        transitions=data.shape[0],
        **episode_fields(returns),
        random_return=random_return,
        expert_return=expert_return,
        sources=sources,
        recipe={**asdict(recipe), "seed": cfg.seed, "frames": cfg.frames, "target_return": target},
        checkpoints={
            "run_dir": str(training.run_dir),
            "behaviour": {**source, "probes": probes},
            "expert": expert_source,
        },
    )
    dataset.save(Path(cfg.out), data, meta)
    return meta
