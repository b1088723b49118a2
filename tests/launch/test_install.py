"""scripts/_env.sh, the install behind both of the README's commands: torch first, as TORCH_SPEC
says and from TORCH_INDEX_URL when set, then the project from pip's own index (PIP_INDEX_URL
honoured). A stand-in Python records every pip call, so nothing is downloaded."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT

pytestmark = pytest.mark.unit

# Makes a venv whose python is this script again, and logs each pip call with the index pip would
# use.
STAND_IN = """#!/usr/bin/env bash
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && ln -s "$0" "$3/bin/python"; exit 0; fi
echo "PIP_INDEX_URL=${PIP_INDEX_URL:-} $*" >> "$PIP_LOG"
"""


def install(tmp_path: Path, **env: str) -> list[str]:
    python = tmp_path / "python3"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    log = tmp_path / "pip.log"
    run_env = {
        **os.environ,
        "PYTHON": str(python),
        "VENV": str(tmp_path / "venv"),
        "PIP_LOG": str(log),
        **env,
    }
    for name in ("TORCH_SPEC", "TORCH_INDEX_URL", "PIP_INDEX_URL"):
        if name not in env:
            run_env.pop(name, None)
    subprocess.run(
        ["bash", "-c", f"source {ROOT / 'scripts' / '_env.sh'}"],
        env=run_env,
        check=True,
        capture_output=True,
    )
    return log.read_text().splitlines()


def test_torch_is_installed_first_as_torch_spec_says_from_torch_index_url(tmp_path):
    cpu_index = "https://download.pytorch.org/whl/cpu"
    calls = install(
        tmp_path,
        TORCH_SPEC="torch==2.9.1",
        TORCH_INDEX_URL=cpu_index,
        PIP_INDEX_URL="https://mirror.example/simple",
    )
    assert len(calls) == 2
    torch_call, project_call = calls
    assert torch_call.endswith(f"--index-url {cpu_index} torch==2.9.1")
    assert (
        "--index-url" not in project_call
        and f"-e {ROOT}" in project_call
        and "constraints.txt" in project_call
    )
    assert all(
        c.startswith("PIP_INDEX_URL=https://mirror.example/simple ") for c in calls
    )  # pip's own index, untouched


def test_by_default_torch_comes_from_pips_index_at_the_pinned_version(tmp_path):
    torch_call, _ = install(tmp_path)
    assert (
        torch_call == "PIP_INDEX_URL= -m pip install -q --disable-pip-version-check torch==2.13.0"
    )
