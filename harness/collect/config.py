"""The ``collector`` config section: how collectors gather experience."""

from __future__ import annotations

from dataclasses import dataclass

from harness.distributed.placement import check_placement


@dataclass
class CollectorConfig:
    """How collectors gather experience."""

    # sync: in round r every collector acts with weights version r (on-policy);
    # async: collectors stream batches, taking the newest weights before every env step.
    mode: str = "sync"
    # sync mode: collect round r+1 with version r while the trainer learns on round r (lag exactly
    # 1)
    pipeline: bool = False
    # async mode: frames older than this many versions when the trainer gets them are dropped
    max_policy_lag: int = 4
    num_envs: int = 4  # envs per collector rank, stepped in one gymnasium SyncVectorEnv
    # frames per collector per batch (a round in sync mode); a multiple of num_envs
    frames_per_batch: int = 256
    total_frames: int = 500_000  # the run ends once trainers have learned from this many env frames
    device: str = "auto"  # auto: cpu, or a GPU per collector with sync=nccl
    threads: str = "auto"  # auto: OMP_NUM_THREADS if set, else one per collector
    # an env that fails (raises; collector.check_obs) is made again, its broken episode dropped, up
    # to this many times per env
    max_env_restarts: int = 3
    # an observation of the wrong shape or dtype, or with a NaN or inf, is an env failure (as
    # raising is)
    check_obs: bool = True
    # a step that lasts longer ends the collector, naming the env; 0: no bound
    env_step_timeout_s: float = 60.0
    # >0: each collector rank runs its envs in a worker process that it replaces, up to this many
    # times, when the worker dies (a crash, a kill, the OOM killer) or stalls (watchdog_s), while
    # the job goes on (docs/runs_that_last.md). 0: a collector's death ends the job (torchrun
    # --max-restarts restarts all of it)
    max_restarts: int = 0
    # max_restarts > 0: a worker that acts yet takes no env step for this long is replaced, and so
    # is one that shows no pulse for this long between batches (stopped, or hung holding the GIL)
    watchdog_s: float = 120.0

    def __post_init__(self) -> None:
        check_placement("collector", self.device, self.threads)
        if self.max_env_restarts < 0:
            raise ValueError(
                "collector.max_env_restarts must be >= 0 (0: an env error ends the run), got "
                f"{self.max_env_restarts}"
            )
        if self.env_step_timeout_s < 0:
            raise ValueError(
                f"collector.env_step_timeout_s={self.env_step_timeout_s}: the seconds an env step "
                "may last must be >= 0 (0: no bound)"
            )
        if self.max_restarts < 0:
            raise ValueError(
                "collector.max_restarts must be >= 0 (0: a collector's death ends the job), "
                f"got {self.max_restarts}"
            )
        if self.watchdog_s <= 0:
            raise ValueError(
                f"collector.watchdog_s={self.watchdog_s}: the seconds a worker may go without "
                "an env step must be > 0"
            )
        if self.mode not in ("sync", "async"):
            raise ValueError(
                f"collector.mode={self.mode!r}: choose sync (on-policy rounds) or async (streaming)"
            )
        if self.pipeline and self.mode != "sync":
            raise ValueError(
                "collector.pipeline=true is a sync-mode option; async mode "
                "overlaps collection anyway"
            )
        if self.max_policy_lag < 0:
            raise ValueError(f"collector.max_policy_lag must be >= 0, got {self.max_policy_lag}")
        counts = {
            "num_envs": "envs per collector",
            "frames_per_batch": "frames per batch",
            "total_frames": "frames to learn from",
        }
        for name, what in counts.items():
            if getattr(self, name) < 1:
                raise ValueError(
                    f"collector.{name}={getattr(self, name)}: the number of {what} must be >= 1"
                )
        if self.frames_per_batch % self.num_envs:
            raise ValueError(
                f"collector.frames_per_batch={self.frames_per_batch} is not a multiple of "
                f"collector.num_envs={self.num_envs}: every env must take the same "
                "number of steps per batch"
            )


@dataclass
class EnvpoolConfig:
    """envpool's own options (``env.backend=envpool``), defaults as CleanRL's
    ``ppo_atari_envpool.py`` makes its envs (``episodic_life`` and ``reward_clip`` on, the rest
    envpool's defaults); evaluation plays the same env with ``reward_clip`` off."""

    episodic_life: bool = True  # a lost life ends the learner's episode (the game goes on)
    reward_clip: bool = True  # rewards clipped to their sign (training; evaluation sees raw ones)
    noop_max: int = 30  # a game starts with 0 to noop_max - 1 single-frame no-ops (envpool's draw)
    use_fire_reset: bool = True  # FIRE after a (re)start in games that have it
    repeat_action_probability: float = 0.0  # sticky actions (the ALE v5 default is 0.25)
    full_action_space: bool = False  # all 18 actions, not the game's minimal set
    max_episode_steps: int = 27_000  # a game's cut-off in agent steps (108,000 frames)
    # 0: envpool's synchronous mode (every env steps each time); 0 < batch_size < num_envs: its
    # asynchronous mode, the collector acting on whichever batch_size envs are ready
    batch_size: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 0:
            raise ValueError(
                f"env.envpool.batch_size={self.batch_size}: 0 (synchronous) or the envs a step "
                "acts on, below collector.num_envs (asynchronous)"
            )
        if self.noop_max < 0 or self.max_episode_steps < 1:
            raise ValueError(
                f"env.envpool.noop_max={self.noop_max} must be >= 0 and "
                f"env.envpool.max_episode_steps={self.max_episode_steps} >= 1"
            )
        if not 0.0 <= self.repeat_action_probability <= 1.0:
            raise ValueError(
                "env.envpool.repeat_action_probability="
                f"{self.repeat_action_probability}: a probability, in [0, 1]"
            )
