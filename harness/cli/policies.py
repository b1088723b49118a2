"""Policies that act outside a training run: a trained one loaded back from
its run directory (or one of its checkpoints), and uniform random actions."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import cast

import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from harness.algos import ALGOS, algorithm_for
from harness.algos.base import AlgoConfig, Policy
from harness.collect.envs import env_spec
from harness.config import plugins
from harness.core import checkpoint
from harness.core.specs import EnvSpec


class RandomPolicy(Policy):
    """Uniform random actions (the random reference, and random datasets)."""

    def __init__(self, spec: EnvSpec):
        super().__init__()
        self.spec = spec

    def forward(
        self, obs: torch.Tensor, values: Mapping[str, float] = {}, deterministic: bool = False
    ) -> TensorDict:
        n, spec = obs.shape[0], self.spec
        if spec.discrete:
            action = torch.randint(0, spec.num_actions, (n,))
        else:
            low, high = torch.tensor(spec.action_low), torch.tensor(spec.action_high)
            action = (low + (high - low) * torch.rand(n, spec.num_actions)).reshape(
                n, *spec.action_shape
            )
        return TensorDict(action=action, batch_size=[n])


def load_policy(path: str, env_id: str) -> tuple[Policy, dict[str, float], dict]:
    """The policy that a run directory's newest valid checkpoint (or the
    checkpoint ``path`` names) holds (acting through the checkpoint's
    observation statistics, if it normalises), the header values it acted with at that
    point of training (DQN's epsilon, say), and a description of where it came from."""
    plugins.import_plugins()  # the run's algorithm may be a plugin's
    where = Path(path)
    run_dir = where.parent.parent if (where / "state.pt").exists() else where
    if not (run_dir / "config.yaml").exists():
        raise FileNotFoundError(
            f"policy={path}: no run directory with a config.yaml there; give a run directory or "
            "one of its checkpoints/step-*"
        )
    run_cfg = OmegaConf.load(run_dir / "config.yaml")
    name = run_cfg.algo.name
    algo_cfg = cast(
        AlgoConfig,
        OmegaConf.to_object(
            OmegaConf.merge(OmegaConf.structured(ALGOS[name].Config), run_cfg.algo)
        ),
    )
    if (where / "state.pt").exists():
        state, meta = checkpoint.read(where)
    else:
        found = checkpoint.load_latest(run_dir, name, run_cfg.env.id)
        if found is None:
            raise FileNotFoundError(f"policy={path}: the run directory has no readable checkpoint")
        state, meta, where = found
    if meta["env"] != env_id:
        raise ValueError(
            f"policy={path} was trained on {meta['env']}, but env.id={env_id}: pick env= to match"
        )
    spec = env_spec(env_id)
    algo = algorithm_for(name, spec)(algo_cfg, spec, run_cfg.collector.total_frames)
    algo.load_state_dict(state["algo"])
    policy = algo.acting_policy(
        algo.published_models()
    )  # behind its observation normaliser, frozen, if it has one
    policy.eval()
    frames = state["progress"]["frames"]
    return (
        policy,
        algo.values_for_header(frames),
        {"policy": str(where), "algo": name, "frames": frames},
    )
