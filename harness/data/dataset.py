"""Offline datasets: transitions in a memory-mapped TensorDict, and what they are.

A dataset is a directory:

- ``data/``: a TensorDict saved with ``memmap`` (one file per field), batch
  size ``[n]``: ``obs``, ``action``, ``reward``, ``next_obs``,
  ``terminated``, ``truncated``;
- ``meta.json``: the env it was collected on, its size, the number, mean and range of the
  returns of the behaviour policy's episodes, and the random and expert reference returns
  that normalised scores use: ``100 * (R - random) / (expert - random)``.

``meta.json`` is written last, so a directory without it is an unfinished write and is refused.
Reading never writes: every file's size is checked against ``meta.json`` before anything is mapped,
and the maps are read-only. ``dataset=minari:<id>`` reads a Minari dataset that is already on this
machine instead (see :mod:`harness.data.minari`)."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import cast

import torch
from tensordict import TensorDict

from harness.data.format import FIELDS, FORMAT, DatasetError, Meta, episode_fields
from harness.data.minari import load_minari


def refuse_existing(path: str | Path) -> None:
    """Refuse to write over a finished dataset."""
    if (Path(path) / "meta.json").exists():
        raise DatasetError(f"{path} already holds a dataset: pick another out= or delete it first")


def allocate(path: str | Path, example: TensorDict, n: int) -> TensorDict:
    """Zero-filled memory-mapped storage for ``n`` transitions shaped like
    ``example`` (batch size ``[]``); writers fill slices of it, possibly from
    several processes (each reopens it with :func:`open_storage`)."""
    path = Path(path)
    refuse_existing(path)
    path.mkdir(parents=True, exist_ok=True)
    return example.select(*FIELDS).expand(n).memmap_like(str(path / "data"), existsok=True)


def open_storage(path: str | Path, read_only: bool = False) -> TensorDict:
    """The memory-mapped transitions of a dataset directory. Never unpickles:
    a dataset is data, and pickle runs code. ``read_only``: mapped
    copy-on-write from files opened for reading, so nothing that reads the
    dataset can change a byte of it, nor grow a file (a shared mapping of a
    file shorter than its tensor extends the file); else shared, for the
    writers of :mod:`harness.cli.dataset`."""
    return TensorDict.load_memmap(
        str(Path(path) / "data"), allow_pickle=False, mode="r" if read_only else None
    )


def field_layout(path: Path) -> dict:
    """``data/meta.json``, tensordict's record of each field's shape and dtype (plain JSON)."""
    try:
        layout = json.loads((path / "data" / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise DatasetError(
            f"{path}/data/meta.json cannot be read ({e}): write the dataset again"
        ) from e
    if not isinstance(layout, dict):
        raise DatasetError(
            f"{path}/data/meta.json is damaged (not a mapping): write the dataset again"
        )
    return layout


def _shape(path: Path, layout: dict, key: str | None) -> tuple[int, ...]:
    """A field's shape in ``data/meta.json`` (``key`` None: the batch's), checked to be one."""
    shape = (layout if key is None else layout[key]).get("shape")
    if not (
        isinstance(shape, list) and shape and all(isinstance(d, int) and d >= 0 for d in shape)
    ):
        raise DatasetError(
            f"{path}/data/meta.json gives {key or 'the batch'} the shape {shape!r}: "
            "write the dataset again"
        )
    return tuple(shape)


def check_sizes(path: Path, meta: Meta) -> None:
    """Before any memory map is made: each field's file must hold exactly
    ``meta.transitions`` rows of the shape and dtype ``data/meta.json`` gives it."""
    layout = field_layout(path)
    missing = [k for k in FIELDS if not isinstance(layout.get(k), dict)]
    shapes = {k: _shape(path, layout, k) for k in FIELDS if k not in missing}
    held = sorted(
        {shape[0] for shape in [_shape(path, layout, None), *shapes.values()]} - {meta.transitions}
    )
    if missing or held:
        raise DatasetError(
            f"{path} is damaged: meta.json says {meta.transitions} transitions, data/ holds "
            f"{', '.join(map(str, held)) or meta.transitions}"
            + (f" and lacks {missing}" if missing else "")
        )
    for key, shape in shapes.items():
        name = str(layout[key].get("dtype", ""))
        dtype = getattr(torch, name.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise DatasetError(
                f"{path}/data/meta.json gives {key} the dtype {name!r}, which is not a torch dtype"
            )
        file = path / "data" / f"{key}.memmap"
        expected = math.prod(shape) * dtype.itemsize
        size = file.stat().st_size if file.exists() else 0
        if size != expected:
            raise DatasetError(
                f"{file} holds {size:,} bytes, but {expected:,} are expected ({meta.transitions} "
                f"transitions of {shape[1:]} {name.removeprefix('torch.')}, as meta.json and "
                "data/meta.json say): it was cut short or written over. Nothing was changed; write "
                "the dataset again (harness dataset)"
            )


def refuse_non_tensors(path: Path) -> None:
    """Before anything of ``path/data`` is loaded: every file must be a
    tensor's ``.memmap`` or a plain TensorDict's ``meta.json``. Anything else
    (a pickled field, a class to import) could run code when loaded."""
    for file in sorted((path / "data").rglob("*")):
        if file.is_dir():
            continue
        if file.name == "meta.json":
            try:
                kind = json.loads(file.read_text()).get("_class")
            except (ValueError, AttributeError) as e:
                raise DatasetError(f"{file} is damaged ({e}): write the dataset again") from e
            if kind == "tensordict:TensorDict":
                continue
        elif file.suffix == ".memmap":
            continue
        raise DatasetError(
            f"dataset {path} holds {file.relative_to(path)}, which is not a tensor "
            "(a pickled field, or a class to import). The harness never unpickles a dataset, "
            "since that can run code: write the dataset again with harness dataset, "
            "from tensors only"
        )


def content_digest(data: TensorDict) -> str:
    """SHA-256 over every field in ``FIELDS`` order: its name, dtype and shape, then its bytes
    (row-major, this machine's byte order), read in slices of 16 MiB so that a memory-mapped
    dataset larger than RAM is never read whole."""
    digest = hashlib.sha256()
    for key in FIELDS:
        tensor = data[key]
        dtype = str(tensor.dtype).removeprefix("torch.")
        digest.update(f"{key}:{dtype}:{list(tensor.shape)}\n".encode())
        flat = tensor.reshape(-1)
        step = max(1, (16 << 20) // max(1, flat.element_size()))
        for start in range(0, flat.numel(), step):
            chunk = flat[start : start + step].contiguous()
            digest.update(chunk.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def verify(path: str | Path) -> Meta:
    """The dataset at ``path`` (read as :func:`load` does), with its bytes checked against the
    digest in its ``meta.json``; a mismatch, or no digest, is a :class:`DatasetError`."""
    data, meta = load(path)
    if meta.digest is None:
        raise DatasetError(
            f"{path}/meta.json records no digest (written before datasets recorded one): nothing "
            "to check it against; write it again to get one"
        )
    check_digest(path, data, meta)
    return meta


def check_digest(path: str | Path, data: TensorDict, meta: Meta) -> None:
    """Refuse data whose bytes are not those its ``meta.json``'s digest was taken of (a dataset
    written before digests were recorded has none to check)."""
    if meta.digest is None:
        return
    found = content_digest(data)
    if found != meta.digest:
        raise DatasetError(
            f"{path} does not hold the data its meta.json describes: the fields' sha256 is "
            f"{found}, meta.json says {meta.digest}. A byte of data/ changed since it was "
            "written; write the dataset again (harness dataset)"
        )


def finish(path: str | Path, meta: Meta) -> None:
    """Record the data's digest in ``meta`` and write ``meta.json`` (atomically): from now on the
    dataset can be read."""
    meta.digest = content_digest(open_storage(path, read_only=True))
    tmp = Path(path) / f".meta.json.{os.getpid()}"
    tmp.write_text(json.dumps(asdict(meta), indent=1))
    os.replace(tmp, Path(path) / "meta.json")


def save(path: str | Path, data: TensorDict, meta: Meta) -> None:
    """Write an in-memory dataset (batch size ``[n]``)."""
    allocate(path, data[0], data.shape[0]).update_(data.select(*FIELDS))
    finish(path, meta)


def load(name: str | Path, env_id: str | None = None) -> tuple[TensorDict, Meta]:
    """The transitions (memory-mapped: nothing is read until sampled) and the
    meta of a dataset directory or of ``minari:<id>``; with ``env_id``, a
    dataset from another env is refused."""
    if str(name).startswith("minari:"):
        data, meta = load_minari(str(name)[len("minari:") :])
    else:
        data, meta = _load_dir(Path(name))
    if env_id is not None and meta.env != env_id:
        raise DatasetError(
            f"dataset {name} was collected on {meta.env}, but this run is env.id={env_id}: "
            f"pick the env it was made for (env=...) or a dataset made for {env_id}"
        )
    return data, meta


def _load_dir(path: Path) -> tuple[TensorDict, Meta]:
    if not path.exists():
        raise DatasetError(
            f"dataset {path} does not exist (nothing is downloaded). Write one with "
            f"`harness dataset env=<env> out={path}` (docs/offline.md), "
            "or pass dataset=minari:<id> for a Minari dataset already on this machine"
        )
    if not (path / "meta.json").exists():
        raise DatasetError(
            f"{path} has no meta.json: its write never finished. Delete it and write it again"
        )
    try:
        meta = Meta(**json.loads((path / "meta.json").read_text()))
    except (ValueError, TypeError) as e:  # not JSON, or not the fields of a Meta
        raise DatasetError(f"{path}/meta.json is damaged ({e}): write the dataset again") from e
    if meta.format != FORMAT:
        raise DatasetError(
            f"{path} has dataset format {meta.format}; this harness reads format {FORMAT}"
        )
    refuse_non_tensors(path)
    check_sizes(path, meta)
    return open_storage(path, read_only=True), meta


def check_shapes(
    name: str, data: TensorDict, obs_shape: tuple[int, ...], action_shape: tuple[int, ...]
) -> None:
    """Refuse a dataset whose observations or actions do not fit the env's."""
    got = (tuple(data["obs"].shape[1:]), tuple(data["action"].shape[1:]))
    if got != (tuple(obs_shape), tuple(action_shape)):
        raise DatasetError(
            f"dataset {name} holds observations {got[0]} and actions {got[1]}, but the env has "
            f"observations {tuple(obs_shape)} and actions {tuple(action_shape)}"
        )


def concatenate(names: list[str], out: str | Path) -> Meta:
    """A mixed dataset: the transitions of every dataset in ``names`` (one
    env), one after another. Reference returns are averaged."""
    if len(names) < 2:
        raise DatasetError("mixing needs at least two datasets")
    loaded = [load(n) for n in names]
    envs = {meta.env for _, meta in loaded}
    if len(envs) > 1:
        raise DatasetError(f"cannot mix datasets of different envs: {sorted(envs)}")
    # A TensorDict: torch.cat dispatches to tensordict's (torch's stub says Tensor).
    data = cast(TensorDict, torch.cat([d.select(*FIELDS).to_tensordict() for d, _ in loaded]))
    metas = [m for _, m in loaded]
    episodes = sum(m.episodes for m in metas)
    behaviour = (
        sum(m.behaviour_return * m.episodes for m in metas) / episodes if episodes else float("nan")
    )

    def mean_of(values: list[float | None]) -> float | None:
        return None if None in values else sum(cast("list[float]", values)) / len(values)

    ranges = [m.return_range for m in metas]
    return_range = None
    if all(ranges):
        return_range = [min(r[0] for r in ranges), max(r[1] for r in ranges)]  # type: ignore[index]

    meta = Meta(
        env=metas[0].env,
        transitions=data.shape[0],
        episodes=episodes,
        behaviour_return=behaviour,
        random_return=mean_of([m.random_return for m in metas]),
        expert_return=mean_of([m.expert_return for m in metas]),
        return_range=return_range,
        sources=[{"dataset": str(n), **s} for n, m in zip(names, metas) for s in m.sources],
    )
    save(out, data, meta)
    return meta


__all__ = [
    "FIELDS",
    "FORMAT",
    "DatasetError",
    "Meta",
    "allocate",
    "check_shapes",
    "concatenate",
    "content_digest",
    "episode_fields",
    "finish",
    "load",
    "open_storage",
    "refuse_existing",
    "save",
    "verify",
]
