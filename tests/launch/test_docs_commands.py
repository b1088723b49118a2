"""Every command of README.md and docs/quickstart.md runs as written, in order, in a fresh copy of
the repository.

The copy holds what a clone would (tracked files, and new ones git does not
ignore) and this checkout's ``.venv``, made by the README's set-up. One thing
is added to a command that trains: a frame budget (``collector.total_frames``),
the last override (Hydra's last value wins), so that 500k frames take seconds here.
What cannot run here is skipped by name, with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
DOCS = ("README.md", "docs/quickstart.md")
BUDGET = "collector.total_frames=2048"
SKIPPED = {
    "git clone": "the copy is the clone",
    "scripts/test.sh": "the test suite: what runs this check",
    "sbatch": "SLURM: tests/distributed/test_slurm.py runs the batch scripts on a real SLURM",
}


def commands(doc: Path) -> list[str]:
    """The ```bash blocks' commands: continuation lines joined, comments dropped."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = re.split(r"\s+#\s", line.strip(), maxsplit=1)[0].strip()
            if command and not command.startswith("#"):
                found.append(command)
    return found


def trains(command: str) -> bool:
    launchers = ("scripts/train.sh", "-m harness.train", "harness train")
    return any(launcher in command for launcher in launchers) and "--help" not in command


def fresh_copy(dest: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    (dest / ".venv").symlink_to(ROOT / ".venv")
    # Older than the .venv's install stamp: installed.
    for name in ("pyproject.toml", "constraints.txt"):
        os.utime(dest / name, (0, 0))
    return dest


def test_the_commands_the_readme_and_the_quickstart_give_run_as_written(tmp_path):
    repo = fresh_copy(tmp_path / "harness")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # The README's set-up: the .venv's commands first (harness, python, torchrun).
    env["PATH"] = f"{repo / '.venv' / 'bin'}:{env['PATH']}"
    ran = []
    for doc in DOCS:
        for command in commands(ROOT / doc):
            if any(word in command for word in SKIPPED):
                continue
            line = f"{command} {BUDGET}" if trains(command) else command
            out = subprocess.run(
                ["bash", "-c", line], cwd=repo, env=env, capture_output=True, text=True, timeout=600
            )
            assert out.returncode == 0, (
                f"{doc}: `{line}` exited {out.returncode}:\n{(out.stdout + out.stderr)[-3000:]}"
            )
            ran.append(line)
    assert len(ran) >= 8, ran  # the docs' commands did run, not only skips
