"""Typed configuration, registered in Hydra's ConfigStore.

``conf/`` holds the YAML groups (``algo/``, ``env/``, ``sync/``, ``logger/``,
``experiment/``, ``debug/``); the dataclasses here are their schemas. Hydra
type-checks every override while composing, and ``load`` runs the
``__post_init__`` checks, all before any process group is made.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Optional, cast

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from harness.algos import (
    ALGOS,
    algorithm_for,
    check_observations,
    check_trainers,
    check_wire_dtype,
    settle_defaults,
)
from harness.collect import envpool_envs
from harness.collect.config import CollectorConfig, EnvpoolConfig
from harness.collect.envs import check_env_id, env_spec
from harness.config import plugins, resolvers
from harness.core.checkpoint import CheckpointConfig
from harness.core.specs import EnvSpec
from harness.distributed.placement import check_placement
from harness.metrics.video import check_video_support
from harness.sync import SCHEMES
from harness.sync.config import SyncConfig


@dataclass
class TopologyConfig:
    """Which ranks do what."""

    trainers: int = 1  # ranks 0..trainers-1 learn; every other rank collects
    # >0: trainer 0 takes collectors of other launches on this port (harness join
    # HOST:PORT) while it runs; async mode, one trainer (docs/scaling.md)
    join_port: int = 0


@dataclass
class TrainerConfig:
    """Where trainer ranks compute (harness/distributed/placement.py)."""

    # auto: a GPU when the node has one (one per trainer, by local rank), else cpu
    device: str = "auto"
    # auto: OMP_NUM_THREADS if set (scripts/*.sh and torchrun set 1), else the node's cores left
    # after one per collector, shared by its trainers; all: every core of the node, shared by its
    # trainers (sync rounds: the collectors wait while they learn)
    threads: str = "auto"
    # A GPU trainer's float32 matrix products and convolutions in TF32 (10-bit mantissa inputs,
    # float32 sums) and cuDNN's autotuned convolutions (cudnn.benchmark); false: full float32
    # products and cuDNN's default algorithms. The layout line says which.
    fast_cuda: bool = True

    def __post_init__(self) -> None:
        check_placement("trainer", self.device, self.threads)


@dataclass
class EnvConfig:
    """A gymnasium environment; its specs are read from the env itself."""

    id: str = "CartPole-v1"  # gymnasium id
    max_episode_steps: Optional[int] = None  # override the registered time limit
    # gymnasium: gym.make (Atari through ale-py, by SB3's wrappers' rules); envpool: the Atari envs
    # through envpool, by its own rules and env.envpool's options (extra .[envpool])
    backend: str = "gymnasium"
    envpool: EnvpoolConfig = field(default_factory=EnvpoolConfig)

    def __post_init__(self) -> None:
        if self.backend not in ("gymnasium", "envpool"):
            raise ValueError(f"env.backend={self.backend!r}: choose gymnasium or envpool")
        if self.backend == "gymnasium":
            check_env_id(self.id)
            return
        envpool_envs.check(self.id)
        if self.max_episode_steps is not None:
            raise ValueError(
                "env.max_episode_steps is the gymnasium backend's cut-off; with "
                "env.backend=envpool set env.envpool.max_episode_steps (agent steps)"
            )

    def spec(self) -> EnvSpec:
        """The env's spaces and time limit, read from one env made for the purpose."""
        if self.backend == "envpool":
            return envpool_envs.envpool_spec(self.id, self.envpool)
        return env_spec(self.id, self.max_episode_steps)


@dataclass
class EvalConfig:
    """Deterministic-policy episodes on a collector rank, with the published weights."""

    # evaluate each time this many more frames were learned from, and the final weights; 0: never
    every_frames: int = 0
    episodes: int = 5  # episodes per evaluation (one per env of a dedicated vector env)
    # record the first episode of the 1st, (K+1)th, ... evaluation to <run_dir>/videos/*.mp4; 0:
    # never
    video_every: int = 0

    def __post_init__(self) -> None:
        if self.every_frames < 0 or self.episodes < 1:
            raise ValueError(
                "eval.every_frames must be >= 0 and eval.episodes >= 1; got "
                f"{self.every_frames}, {self.episodes}"
            )
        if self.video_every < 0:
            raise ValueError(
                f"eval.video_every must be >= 0 (0: no videos), got {self.video_every}"
            )
        if self.video_every:
            check_video_support()


LOGGER_BACKENDS = ("csv", "wandb", "tensorboard")


@dataclass
class LoggerConfig:
    """Trainer 0's metrics: always a CSV in the run directory and console progress; wandb and
    TensorBoard on request."""

    # any of csv, wandb, tensorboard; metrics.csv is written regardless
    backends: list[str] = field(default_factory=lambda: ["csv"])
    # one row (CSV, wandb, TensorBoard, console figures) per this many frames, and one at each
    # checkpoint (a resume starts from one, so the rows meet there)
    log_every_frames: int = 10_000
    # trainer 0's progress: a bar redrawn in place on a terminal, else one plain line per row
    console: bool = True
    # wandb: online | offline (no network; upload later with wandb sync) | disabled
    mode: str = "online"
    project: str = "harness"  # wandb project
    entity: Optional[str] = None  # wandb team or user; default: the logged-in user's
    # wandb group; default: the experiment preset's name (else <algo>-<env>), shared by a sweep's
    # runs
    group: Optional[str] = None
    name: Optional[str] = None  # wandb run name; default: the run directory's name
    # wandb tags, after the algo, env and sync scheme (always tagged)
    tags: list[str] = field(default_factory=list)
    init_timeout_s: float = 60.0  # give up on reaching wandb after this long (training goes on)

    def __post_init__(self) -> None:
        unknown = [b for b in self.backends if b not in LOGGER_BACKENDS]
        if unknown:
            raise ValueError(
                f"logger.backends={list(self.backends)}: {unknown} unknown; choose from "
                f"{list(LOGGER_BACKENDS)}, e.g. logger.backends=[csv,wandb,tensorboard] (or "
                "logger=wandb / logger=tensorboard)"
            )
        if self.mode not in ("online", "offline", "disabled"):
            raise ValueError(f"logger.mode={self.mode!r}: choose online, offline or disabled")
        if self.log_every_frames < 1:
            raise ValueError(f"logger.log_every_frames must be >= 1, got {self.log_every_frames}")


@dataclass
class Config:
    """The whole job. Every rank composes the same one."""

    algo: Any = MISSING  # one of conf/algo/*.yaml, typed by its algorithm's dataclass
    env: EnvConfig = field(default_factory=EnvConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    seed: int = 1  # fixes every rank's envs and networks
    # shared by all ranks; default: <runs_root>/<run_name>, else <runs_root>/<launch
    # time>-<algo>-<env>-seed<seed>
    run_dir: Optional[str] = None
    # the run directory <runs_root>/<run_name>, which the same command resumes; in a sweep (-m), the
    # sweep's directory
    run_name: Optional[str] = None
    runs_root: str = "runs"  # where default run directories go
    dist_timeout_s: float = 120.0  # start-up and data channel timeout
    # a trainer names, in its log, a collector whose batch it has waited for this long, or that
    # sent none for this long while the others did (a stopped or stalled rank); 0: never
    dist_late_s: float = 30.0
    # offline algorithms: a dataset directory (harness dataset) or minari:<id>
    dataset: Optional[str] = None

    def __post_init__(self) -> None:
        ALGOS[self.algo.name].check_dataset(self.algo.name, self.dataset)
        if self.seed < 0:
            # Every rank derives its seeds from this one (rank r's envs: seed + r * num_envs
            # onwards), and gymnasium refuses a negative seed only when the first env is reset, on
            # one rank.
            raise ValueError(
                f"seed={self.seed}: seeds must be >= 0, since every rank's envs and networks "
                "derive theirs from it: pick seed=0 or more"
            )
        self._check_run_name()
        if self.dist_timeout_s <= 0:
            raise ValueError(
                "dist_timeout_s must be > 0 (seconds a rank waits for its peers), got "
                f"{self.dist_timeout_s}"
            )
        if self.dist_late_s < 0:
            raise ValueError(
                f"dist_late_s must be >= 0 (0: never name a late collector), got {self.dist_late_s}"
            )
        check_trainers(self.algo.name, self.algo, self.topology.trainers, self.collector.mode)
        self._check_join()
        if self.collector.max_restarts and SCHEMES[self.sync.name].gpu_collectors:
            raise ValueError(
                f"collector.max_restarts={self.collector.max_restarts} with sync={self.sync.name}: "
                "a replaceable collector takes its weights from its rank through the node's shared "
                "memory, and NCCL delivers them into each collector's GPU, in a group fixed when "
                "the job starts. Use sync=gloo, shm or hierarchical"
            )
        settle_defaults(self.algo, self.collector.mode, self.collector.pipeline)
        check_wire_dtype(self.algo, self.sync.wire_dtype)

    def _check_join(self) -> None:
        port = self.topology.join_port
        if not port:
            return
        if not 0 < port < 65536:
            raise ValueError(
                f"topology.join_port={port}: a TCP port is 1-65535 (0: no collectors join)"
            )
        why: Optional[str]
        if self.collector.mode != "async":
            why = (
                "collector.mode=sync: a round takes one batch from each of the job's collectors; "
                "use collector.mode=async"
            )
        elif self.topology.trainers != 1:
            why = (
                "several trainers learn from equal shares of the frames, which collectors that "
                "come and go would upset"
            )
        else:
            why = ALGOS[self.algo.name].refuses_joining(self.algo.name)
        if why:
            raise ValueError(f"topology.join_port={port}: collectors cannot join this job: {why}")

    def _check_run_name(self) -> None:
        name = self.run_name
        if name is not None and (not name or name in (".", "..") or "/" in name):
            raise ValueError(
                f"run_name={name!r}: a run's name is one folder name under "
                f"runs_root={self.runs_root}; for a path, give run_dir={name or 'PATH'} instead"
            )
        if name and self.run_dir:
            raise ValueError(
                f"run_name={name} and run_dir={self.run_dir} both name the run directory: give one "
                "of them"
            )

    @property
    def algo_env(self) -> str:
        """``<algo>-<env id>``: the default wandb group, and the middle of a default run directory's
        name."""
        return f"{self.algo.name}-{self.env.id}"


def register_configs() -> None:
    """The schemas, in Hydra's ConfigStore, and the resolvers ``conf/config.yaml`` names;
    first the plugins' algorithms and schemes (:mod:`harness.config.plugins`)."""
    plugins.import_plugins()
    resolvers.register()
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for name, algo in ALGOS.items():
        # Out of algo/: not a choice of its own.
        cs.store(group="schema/algo", name=name, node=algo.Config)


def _keys(node: Any, prefix: str = "") -> set[str]:
    if not isinstance(node, dict) or not node:
        return {prefix}
    return {key for k, v in node.items() for key in _keys(v, f"{prefix}.{k}" if prefix else str(k))}


def check_known_keys(cfg: DictConfig, typed: Config) -> None:
    """Refuse keys no section declares. Hydra's ``+key=value`` adds keys past
    the schema (it is what Hydra suggests for a typo), and they would be
    silently ignored; name the nearest real key instead."""
    known = _keys(OmegaConf.to_container(OmegaConf.structured(typed)))
    unknown = sorted(_keys(OmegaConf.to_container(cfg, resolve=False)) - known)
    if unknown:
        hints = [
            f"{k} (did you mean {close[0]}?)"
            if (close := difflib.get_close_matches(k, known, n=1))
            else k
            for k in unknown
        ]
        raise ValueError(
            f"unknown config keys: {', '.join(hints)}. Every setting is declared in "
            "harness/config/schema.py or its algorithm's file; check the spelling, and drop a "
            "leading +"
        )


def load(cfg: DictConfig) -> Config:
    """The composed config as typed objects; runs every ``__post_init__`` check."""
    if cfg.get("algo") is None or cfg.algo.get("name") not in ALGOS:
        raise ValueError(
            f"algo={cfg.get('algo', {}).get('name')!r} is not an algorithm; choose one of "
            f"{sorted(ALGOS)}"
        )
    typed = cast(Config, OmegaConf.to_object(cfg))  # composed on base_config: a Config
    check_known_keys(cfg, typed)
    check_envpool_fits(typed)
    check_algo_fits_env(typed)
    return typed


def check_envpool_fits(cfg: Config) -> None:
    """``env.backend=envpool``'s settings that depend on other sections."""
    if cfg.env.backend != "envpool":
        return
    batch_size, num_envs = cfg.env.envpool.batch_size, cfg.collector.num_envs
    if batch_size >= num_envs:
        raise ValueError(
            f"env.envpool.batch_size={batch_size} with collector.num_envs={num_envs}: 0 "
            "(synchronous) or fewer envs than the collector has (asynchronous)"
        )
    if cfg.eval.video_every:
        raise ValueError(
            "eval.video_every with env.backend=envpool: envpool draws no pictures; record videos "
            "with env.backend=gymnasium (harness evaluate video=true)"
        )


def check_algo_fits_env(cfg: Config) -> None:
    """Before any process group: build the policy once, so that an algorithm
    given an action space it cannot act in (``algo=sac env=cartpole``) is
    refused by its own message now, not on every rank later. On the meta device: shapes only, no
    memory or initialisation (ppo_wide's orthogonal init alone takes 45 s on one CPU thread)."""
    spec = cfg.env.spec()
    check_observations(cfg.algo.name, cfg.algo, spec, cfg.env.id)
    with torch.device("meta"):
        algorithm_for(cfg.algo.name, spec).make_policy(cfg.algo, spec)
