"""Algorithms, selected by ``algo.name``.

Adding one: a file with its config dataclass, policy and ``Algorithm``
subclass; one line in ``ALGOS``; one ``conf/algo/<name>.yaml``.

``ALGOS[name]`` holds what every form of an algorithm shares (its ``Config``,
``offline``, ``data_parallel_trainers``, the checks of its settings); an entry
may have another class for discrete actions (``cql``: ``DiscreteCQL``, in
``DISCRETE_FORMS``). Whatever builds an algorithm or its models asks
:func:`algorithm_for` which class learns on the env's action space.
"""

from __future__ import annotations

from harness.algos.base import AlgoConfig, Algorithm, Policy, part_of
from harness.algos.bc import BC
from harness.algos.cql import CQL
from harness.algos.cql_discrete import DiscreteCQL
from harness.algos.dqn import DQN
from harness.algos.iql import IQL
from harness.algos.offpolicy import OffPolicyConfig
from harness.algos.ppo import PPO, PPOConfig
from harness.algos.sac import SAC
from harness.algos.td3 import TD3
from harness.core.specs import EnvSpec

ALGOS: dict[str, type[Algorithm]] = {
    "ppo": PPO,
    "sac": SAC,
    "td3": TD3,
    "dqn": DQN,
    "iql": IQL,
    "cql": CQL,
    "bc": BC,
}
DISCRETE_FORMS: dict[str, type[Algorithm]] = {"cql": DiscreteCQL}


def algorithm_for(name: str, spec: EnvSpec) -> type[Algorithm]:
    """The class that learns ``algo=name`` on ``spec``'s action space."""
    return DISCRETE_FORMS.get(name, ALGOS[name]) if spec.discrete else ALGOS[name]


def check_observations(name: str, cfg: AlgoConfig, spec: EnvSpec, env_id: str) -> None:
    """Refuse, saying what to do, an algorithm that cannot take ``spec``'s observations (images)."""
    if not spec.pixels:
        if getattr(cfg, "replay_frames", False):
            raise ValueError(
                f"algo.replay_frames=true stores stacked image frames once; env.id={env_id} "
                f"observes state vectors {spec.obs_shape}: drop algo.replay_frames"
            )
        return
    if not algorithm_for(name, spec).takes_pixels:
        takers = sorted(n for n in ALGOS if algorithm_for(n, spec).takes_pixels)
        raise ValueError(
            f"env.id={env_id} observes images {spec.obs_shape}, and algo={name} takes state "
            "vectors only (its critics take an observation and an action together, through "
            f"MLPs). For images use algo={' or algo='.join(takers)}"
        )
    if cfg.normalize_obs:
        raise ValueError(
            f"algo.normalize_obs=true with images ({env_id}): an image's bytes are scaled by "
            "1/255 inside the network; drop algo.normalize_obs"
        )


def check_trainers(name: str, cfg: AlgoConfig, trainers: int, mode: str) -> None:
    """Refuse, saying what to do, how ``algo=name`` cannot be trained: on several trainers (it
    averages no gradients, or its batch does not split over them), or with async collectors
    (a reward scale that needs each env's rewards in order)."""
    if trainers > 1 and not ALGOS[name].data_parallel_trainers:
        raise ValueError(
            f"topology.trainers={trainers}: algo={name} learns on one trainer. Offline "
            "algorithms take gradient steps on a dataset while collectors only evaluate, so more "
            "trainers add no data, and their loop does not average gradients yet. Use "
            "topology.trainers=1 (add collector ranks to evaluate more)"
        )
    if trainers > 1 and isinstance(cfg, OffPolicyConfig) and cfg.batch_size % trainers:
        raise ValueError(
            f"algo.batch_size={cfg.batch_size} cannot be split over topology.trainers={trainers} "
            f"(each samples batch_size / {trainers} from its own replay): use a multiple of "
            f"{trainers}, e.g. algo.batch_size={cfg.batch_size // trainers * trainers or trainers}"
        )
    if getattr(cfg, "normalize_reward", False) and mode != "sync":
        raise ValueError(
            "algo.normalize_reward=true with collector.mode=async: the reward scale follows each "
            "env's discounted return, round by round, which only sync mode delivers in order. "
            "Use collector.mode=sync."
        )


def check_wire_dtype(cfg: AlgoConfig, wire_dtype: str) -> None:
    """Refuse weights rounded on the wire (``sync.wire_dtype``) where they would change what the
    algorithm computes without saying so: on-policy PPO (``algo.vtrace=false``) takes each action's
    log-probability recorded by the collector as the trainer's own, so that the first epoch's
    ratio is 1; from rounded weights it is not, and the clipping starts off-centre. V-trace
    corrects for the difference, and the off-policy algorithms learn from any behaviour."""
    if wire_dtype != "float32" and isinstance(cfg, PPOConfig) and not cfg.vtrace:
        raise ValueError(
            f"sync.wire_dtype={wire_dtype} with algo=ppo and algo.vtrace=false: collectors would "
            "act with rounded weights and record log-probabilities that the trainer's weights do "
            "not give, which skews PPO's ratio and clipping. Use sync.wire_dtype=float32, or "
            "algo.vtrace=true (it corrects for the difference)"
        )


def settle_defaults(cfg: AlgoConfig, mode: str, pipeline: bool) -> None:
    """The settings whose default follows how collectors act: PPO's ``vtrace`` (null) is on where
    frames are older than the weights (``collector.mode=async`` or ``collector.pipeline``)."""
    if isinstance(cfg, PPOConfig) and cfg.vtrace is None:
        cfg.vtrace = mode == "async" or pipeline


__all__ = [
    "ALGOS",
    "DISCRETE_FORMS",
    "AlgoConfig",
    "Algorithm",
    "Policy",
    "algorithm_for",
    "check_observations",
    "check_trainers",
    "check_wire_dtype",
    "part_of",
    "settle_defaults",
]
