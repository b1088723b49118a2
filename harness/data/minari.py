"""``dataset=minari:<id>``: a Minari dataset already on this machine, as transitions.

Minari keeps datasets under ``$MINARI_DATASETS_PATH`` (default
``~/.minari/datasets``). Nothing is downloaded: a missing dataset is an error
that says how to get it. Minari stores episodes (``T + 1`` observations,
``T`` actions); they become ``T`` transitions each. Its reference scores
(``ref_min_score`` / ``ref_max_score``), when the dataset has them, are the
random and expert returns of normalised scores.
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from harness.data.format import FIELDS, DatasetError, Meta, episode_fields


def load_minari(dataset_id: str) -> tuple[TensorDict, Meta]:
    """The transitions and meta of the Minari dataset ``dataset_id`` on this machine."""
    try:
        import minari
        from minari.storage import get_dataset_path
    except ImportError as e:
        raise DatasetError(
            f"dataset=minari:{dataset_id} needs Minari: pip install -e '.[offline]'"
        ) from e
    where = get_dataset_path(dataset_id)
    if not (where / "data").exists():
        raise DatasetError(
            f"Minari dataset {dataset_id!r} is not on this machine (looked in {where}; nothing is "
            f"downloaded). On a machine with network access run `minari download {dataset_id}` and "
            "copy the directory here (or point MINARI_DATASETS_PATH at it), or write a dataset "
            "with `harness dataset`"
        )
    dataset = minari.load_dataset(dataset_id)
    parts: dict[str, list[np.ndarray]] = {k: [] for k in FIELDS}
    returns = []
    for episode in dataset.iterate_episodes():
        if not isinstance(episode.observations, np.ndarray):
            raise DatasetError(
                f"Minari dataset {dataset_id!r} has structured observations; only Box "
                "observations are supported"
            )
        parts["obs"].append(episode.observations[:-1])
        parts["next_obs"].append(episode.observations[1:])
        parts["action"].append(episode.actions)
        parts["reward"].append(episode.rewards)
        parts["terminated"].append(episode.terminations)
        parts["truncated"].append(episode.truncations)
        if episode.terminations[-1] or episode.truncations[-1]:
            returns.append(float(np.sum(episode.rewards)))
    data = {k: torch.from_numpy(np.concatenate(v)) for k, v in parts.items()}
    for k in ("obs", "next_obs", "reward"):
        data[k] = data[k].float()
    for k in ("terminated", "truncated"):
        data[k] = data[k].bool()
    if data["action"].is_floating_point():
        data["action"] = data["action"].float()
    n = data["reward"].shape[0]
    info = dataset.storage.metadata
    env_spec = dataset.spec.env_spec
    if env_spec is None:
        raise DatasetError(f"Minari dataset {dataset_id!r} does not say which env it is from")
    meta = Meta(
        env=env_spec.id,
        transitions=n,
        **episode_fields(returns),
        random_return=info.get("ref_min_score"),
        expert_return=info.get("ref_max_score"),
        sources=[{"minari": dataset_id, "algorithm": info.get("algorithm_name")}],
    )
    return TensorDict(data, batch_size=[n]), meta
