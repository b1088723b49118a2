"""``harness gpu-check --rehearse``: the GPU machine's install and check, rehearsed on this CPU
machine (docs/gpu.md, "Rehearsing it here").

1. A wheelhouse for this Python, made by the code that makes the GPU machine's
   (:func:`harness.cli.gpu_check.wheelhouse.fetch`: the index is needed) and checked the same way.
2. A fresh virtual environment (no system site packages) holding only what the GPU image has of
   the harness's needs: torch and :data:`~harness.cli.gpu_check.wheelhouse.IMAGE_HAS`, with what
   they require, linked from this Python's site-packages (no copy of torch).
3. ``harness gpu-check --dry-run`` run by that environment's Python, as the GPU machine runs
   ``python3 -m harness gpu-check``: it finds tensordict, Hydra and gymnasium missing, installs the
   wheelhouse with ``pip install --no-index --no-deps --target``, then runs every step on the CPU.

What it cannot prove: CUDA (kernels, streams, NCCL, compile for a GPU), the GPU image's torch
(2.11 there; this one's here) and its own package versions, and the cp312 wheels themselves
(their tags are only checked from their names).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from harness.cli.gpu_check.wheelhouse import IMAGE_HAS, ROOT, fetch, report

CANNOT_PROVE = (
    "what a rehearsal on the CPU cannot prove: CUDA (kernels, streams, events, NCCL, "
    "torch.compile for a GPU), the GPU image's torch 2.11 and its package versions (this one: "
    "torch {torch}), and that the cp312 wheels install (their tags were checked from their names)"
)


def requirement_closure(names: tuple[str, ...]) -> list[metadata.Distribution]:
    """The installed distributions of ``names`` and of everything they require (no extras), as
    this Python has them; the names it lacks (triton on a CPU machine) are left out."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        try:
            dist = metadata.distribution(todo.pop())
        except metadata.PackageNotFoundError:
            continue
        name = canonicalize_name(dist.metadata["Name"])
        if name in found:
            continue
        found[name] = dist
        for line in dist.requires or []:
            required = Requirement(line)
            if required.marker is None or required.marker.evaluate({"extra": ""}):
                todo.append(required.name)
    return list(found.values())


def link_distribution(dist: metadata.Distribution, site: Path) -> None:
    """Symbolic links in ``site`` to the files ``dist`` installed: its top-level packages,
    modules and metadata; in a namespace package (``google/``, no ``__init__.py``) only its own
    part, so that another distribution's part of it stays behind."""
    source = Path(str(dist.locate_file("")))
    tops: dict[str, set[str]] = {}
    for path in dist.files or []:
        parts = Path(path).parts
        if parts[0] in ("..", "__pycache__"):  # scripts in bin/; byte code
            continue
        tops.setdefault(parts[0], set()).add(parts[1] if len(parts) > 1 else "")
    for top, below in tops.items():
        namespace = (source / top).is_dir() and not (source / top / "__init__.py").exists()
        if namespace and top.isidentifier():
            (site / top).mkdir(exist_ok=True)
            for part in filter(None, below):
                if not (site / top / part).exists():
                    (site / top / part).symlink_to(source / top / part)
        elif not (site / top).exists():
            (site / top).symlink_to(source / top)


def image_like_venv(where: Path) -> Path:
    """A virtual environment at ``where`` with only what the GPU image has of the harness's needs
    (linked from this Python); its Python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = where / "bin" / "python"
    found = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    site = Path(found.stdout.strip())
    for dist in requirement_closure(("torch", *IMAGE_HAS)):
        link_distribution(dist, site)
    return python


def isolated_env(**extra: str) -> dict[str, str]:
    """This environment less what would show the venv this Python's packages."""
    shown = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHON")  # PYTHON: harness gpu-check's own choice
    env = {k: v for k, v in os.environ.items() if k not in shown}
    return {**env, **extra}


def rehearse(out: str | None) -> int:
    """Steps 1 to 3 of the module's docstring in a temporary directory; the dry run's status."""
    import torch  # only to name the version this rehearsal ran with

    target = sys.version_info[:2]
    with tempfile.TemporaryDirectory(prefix="gpu-check-rehearsal-") as tmp:
        wheelhouse, site = Path(tmp) / "wheelhouse", Path(tmp) / "site"
        print(f"rehearsal: 1. a wheelhouse for CPython {target[0]}.{target[1]} in {wheelhouse}")
        fetch(sys.executable, wheelhouse, target)
        if report(wheelhouse, target):
            return 1
        print("rehearsal: 2. a virtual environment with torch and the GPU image's packages only")
        python = image_like_venv(Path(tmp) / "venv")
        print(f"rehearsal: 3. {python} -m harness gpu-check --dry-run (installs into {site})")
        command = [str(python), "-m", "harness", "gpu-check", "--dry-run"]
        command += ["--out", out] if out else []
        env = isolated_env(WHEELHOUSE=str(wheelhouse), SITE=str(site))
        status = subprocess.run(command, cwd=ROOT, env=env).returncode
    print("rehearsal: " + CANNOT_PROVE.format(torch=torch.__version__))
    return status
