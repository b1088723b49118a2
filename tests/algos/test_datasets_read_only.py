"""Reading a dataset never writes to it: damaged ones are refused before any
memory map is made, and what is mapped is read-only. Real datasets, written by
``harness.cli.dataset``, compared by hash before and after."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import run_harness, snapshot

from harness.data import dataset

OBS_BYTES = 2000 * 3 * 4  # 2,000 Pendulum transitions of 3 float32s


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("written")
    done = run_harness(
        ["env=pendulum", "out=ds", "frames=2000"], where, module="harness.cli.dataset"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (where / "ds/data/obs.memmap").stat().st_size == OBS_BYTES
    return where / "ds"


def cut_short(ds: Path) -> str:
    obs = ds / "data/obs.memmap"
    obs.write_bytes(obs.read_bytes()[: OBS_BYTES // 2])
    return (
        "ds/data/obs.memmap holds 12,000 bytes, but 24,000 are expected (2000 transitions of "
        "(3,) float32"
    )


def claims_another_shape(ds: Path) -> str:
    layout = json.loads((ds / "data/meta.json").read_text())
    layout["obs"]["shape"] = [2000, 4]  # a field that does not fit its file
    (ds / "data/meta.json").write_text(json.dumps(layout))
    return (
        "ds/data/obs.memmap holds 24,000 bytes, but 32,000 are expected (2000 transitions of "
        "(4,) float32"
    )


@pytest.mark.e2e
@pytest.mark.parametrize("damage", [cut_short, claims_another_shape])
def test_a_damaged_dataset_is_refused_naming_the_file_and_sizes_and_no_byte_changes(
    workdir, written, damage
):
    ds = Path(shutil.copytree(written, workdir / "ds"))
    message = damage(ds)
    before = snapshot(ds)
    out = run_harness(
        ["algo=iql", "env=pendulum", "dataset=ds", "run_dir=run"], workdir, nproc=2, timeout=120
    )
    assert out.returncode != 0 and message in out.stderr, out.stderr[-3000:]
    assert snapshot(ds) == before and not (workdir / "run").exists()


@pytest.mark.unit
def test_a_loaded_dataset_is_mapped_read_only(tmp_path, written):
    ds = Path(shutil.copytree(written, tmp_path / "ds"))
    before = snapshot(ds)
    data, _ = dataset.load(ds, "Pendulum-v1")
    data["obs"][0] = torch.full((3,), 99.0)  # in memory only: the map is copy-on-write
    data["reward"].mul_(2)
    assert float(data["obs"][0, 0]) == 99.0
    del data
    assert snapshot(ds) == before
