"""The online presets of ``harness results sota`` and the published figure each is compared with:
a figure is for the env rules the preset plays by (docs/pixels.md names them for Atari)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Published:
    """A preset's algorithm and task, and the published score it is compared with."""

    algo: str
    task: str
    score: str  # mean ± std over seeds, and where it comes from
    frames: int  # the budget it was published at
    # what to train, where the name is not itself a preset: experiment=... and overrides
    launch: tuple[str, ...] = ()
    nproc: int = 2  # torchrun's processes: 1 trainer + the collectors the preset's settings are for


def sb3_atari(
    algo: str, game: str, script: str, score: str, launch: tuple[str, ...] = ()
) -> Published:
    """An ale-py Atari row: its env follows SB3's Atari wrappers as CleanRL's ``script`` uses them
    on ``<game>NoFrameskip-v4`` (harness/collect/pixels.py), so its published figure is that
    script's on that env (CleanRL's docs: 3 seeds, 10M agent steps of 4 frames), not
    ``ppo_atari_envpool.py``'s on envpool's ``<game>-v5`` (other rules; docs/pixels.md has both)."""
    task = f"{game} (ale-py, SB3 wrappers' rules as CleanRL {script})"
    published = f"{score} (CleanRL {script}, {game}NoFrameskip-v4)"
    return Published(algo, task, published, 10_000_000, launch, nproc=3)


PRESETS = {
    "ppo_cartpole": Published(
        "PPO", "CartPole-v1", "500 ± 0 (rl-baselines3-zoo)", 100_000, nproc=3
    ),
    "dqn_cartpole": Published("DQN", "CartPole-v1", "489 ± 16 (CleanRL)", 500_000),
    "sac_pendulum": Published("SAC", "Pendulum-v1", "about -150", 20_000),
    "td3_pendulum": Published("TD3", "Pendulum-v1", "about -150", 20_000),
    "ppo_halfcheetah": Published("PPO", "HalfCheetah-v5", "1443 ± 46 on v4 (CleanRL)", 1_000_000),
    "sac_halfcheetah": Published("SAC", "HalfCheetah-v5", "9635 ± 1424 on v4 (CleanRL)", 1_000_000),
    "td3_halfcheetah": Published("TD3", "HalfCheetah-v5", "9583 ± 126 on v4 (CleanRL)", 1_000_000),
    "sac_hopper": Published("SAC", "Hopper-v5", "2310 ± 343 on v4 (CleanRL)", 1_000_000),
    "td3_hopper": Published("TD3", "Hopper-v5", "3135 ± 360 on v4 (CleanRL)", 1_000_000),
    "ppo_atari": sb3_atari("PPO", "Breakout", "ppo_atari.py", "414.7 ± 28.1"),
    "dqn_atari": sb3_atari("DQN", "Breakout", "dqn_atari.py", "366.9 ± 39.9"),
    "ppo_atari_pong": sb3_atari(
        "PPO", "Pong", "ppo_atari.py", "20.4 ± 0.2", ("experiment=ppo_atari", "env=pong")
    ),
    # env.backend=envpool: envpool's rules, so ppo_atari_envpool.py's figure (CleanRL
    # docs/benchmark/ppo_atari_envpool.md, 3 seeds at 10M)
    "ppo_atari_envpool": Published(
        "PPO",
        "Breakout (envpool, its rules as CleanRL ppo_atari_envpool.py)",
        "211.2 ± 151.8 (CleanRL ppo_atari_envpool.py, Breakout-v5)",
        10_000_000,
        nproc=3,
    ),
}
