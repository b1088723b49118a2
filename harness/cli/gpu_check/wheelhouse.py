"""The wheels a GPU machine without a package index needs, made for its Python (docs/gpu.md).

:func:`fetch` downloads what the GPU image lacks of the harness's dependencies, each at the
version ``constraints.txt`` pins, with pip's ``--python-version``/``--platform`` set to the
machine's Python (CPython 3.12 on x86_64 Linux), not the one running the fetch: a cp311 wheel is
refused there, and one refused wheel fails the whole ``--no-index`` install. :func:`problems`
checks a wheelhouse from its file names and sizes alone (no network, no pip): every wheel's tags fit
the target Python, one version of each, each at its pin, nothing the image already has, and the
tree that travels plus the wheels under :data:`LIMIT_BYTES`. Only the standard library: ``harness
gpu-check`` runs this on a Python that may lack everything else.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TARGET = (3, 12)  # the GPU image's python3 (3.12.3)
# The newest glibc a manylinux wheel may ask for there: Ubuntu 24.04's, whose Python 3.12.3 the
# image runs (an inference from that version, not read on the machine).
TARGET_GLIBC_MINOR = 39
# pip matches each --platform exactly: the manylinux tags the pinned wheels are published under.
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# What the GPU image lacks of the harness's dependencies (and of theirs): ale-py for ppo_atari's
# Breakout. No row of the check makes a MuJoCo environment, so mujoco stays behind.
NEEDED = (
    "tensordict",
    "pyvers",
    "hydra-core",
    "omegaconf",
    "antlr4-python3-runtime",
    "gymnasium",
    "Farama-Notifications",
    "ale-py",
)
# Published as source only (4.9.3, hydra's parser): built here into a py3-none-any wheel.
SOURCE_ONLY = ("antlr4-python3-runtime",)
# What the GPU image already has of the harness's dependencies and the check's tools (its package
# list, read there on 2026-11-17): a wheel of one only adds bytes to carry (opencv alone is 61 MiB).
IMAGE_HAS = (
    "torch",
    "triton",
    "numpy",
    "opencv-python-headless",
    "matplotlib",
    "tensorboard",
    "rich",
    "cloudpickle",
    "pyyaml",
    "packaging",
    "typing-extensions",
    "pytest",
    "pytest-timeout",
    "pillow",
)
# A call carries at most 64 MiB (tree and wheels together); 8 MiB are kept for the tree to grow.
LIMIT_BYTES = 56 * 2**20
MIB = 2**20
WHEEL_NAME = re.compile(
    r"(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl"
)


def normalized(name: str) -> str:
    """A distribution's name as PEP 503 compares them (``Farama_Notifications`` is
    ``farama-notifications``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(constraints: Path = ROOT / "constraints.txt") -> dict[str, str]:
    """``{normalized name: version}`` of every ``name==version`` line."""
    found = {}
    for line in constraints.read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.split("==", 1)
            found[normalized(name.strip())] = version.strip()
    return found


def pinned(names: tuple[str, ...] | list[str]) -> list[str]:
    """``name==version`` for each name, as constraints.txt pins it (the name alone where not)."""
    versions = pins()
    return [f"{n}=={versions[normalized(n)]}" if normalized(n) in versions else n for n in names]


def platform_fits(platform: str, glibc_minor: int = TARGET_GLIBC_MINOR) -> bool:
    """Whether pip on x86_64 Linux with that glibc takes a wheel of this platform tag."""
    legacy = ("manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64")
    if platform in ("any", "linux_x86_64", *legacy):
        return True
    found = re.fullmatch(r"manylinux_2_(\d+)_x86_64", platform)
    return found is not None and int(found[1]) <= glibc_minor


def tag_fits(py: str, abi: str, platform: str, target: tuple[int, int] = TARGET) -> bool:
    """Whether CPython ``target`` on x86_64 Linux takes the tag ``py-abi-platform`` (PEP 425, as
    pip's supported tags list them: cpXY with its ABI, abi3 from older cp3x, pure py3/py3x)."""
    if not platform_fits(platform):
        return False
    cp = f"cp{target[0]}{target[1]}"
    found = re.fullmatch(r"(cp|py)(\d)(\d*)", py)
    if found is None or int(found[2]) != target[0]:
        return False
    kind, minor = found[1], int(found[3]) if found[3] else None
    if abi == cp:
        return py == cp
    if abi == "abi3":
        return kind == "cp" and minor is not None and minor <= target[1]
    if abi == "none":
        return py == cp or (kind == "py" and (minor is None or minor <= target[1]))
    return False


def wheel_fits(filename: str, target: tuple[int, int] = TARGET) -> bool:
    """Any of a wheel's tags (each part may list several, dot-separated) fits ``target``."""
    parts = WHEEL_NAME.fullmatch(filename)
    if parts is None:
        return False
    return any(
        tag_fits(py, abi, plat, target)
        for py in parts["py"].split(".")
        for abi in parts["abi"].split(".")
        for plat in parts["plat"].split(".")
    )


def problems(
    wheels: Mapping[str, int],
    tree_bytes: int,
    target: tuple[int, int] = TARGET,
    needed: tuple[str, ...] = NEEDED,
    versions: Mapping[str, str] | None = None,
) -> list[str]:
    """What would stop ``pip install --no-index --no-deps`` of ``wheels`` (file name: bytes) on
    CPython ``target``, or the call that carries them with a tree of ``tree_bytes``; [] if nothing.
    """
    versions = pins() if versions is None else versions
    python = f"CPython {target[0]}.{target[1]} on x86_64 Linux"
    found: list[str] = []
    seen: dict[str, list[str]] = {}
    for filename in sorted(wheels):
        parts = WHEEL_NAME.fullmatch(filename)
        if parts is None:
            found.append(f"{filename}: not a wheel's file name (name-version-py-abi-platform.whl)")
            continue
        name, version = normalized(parts["name"]), parts["version"]
        seen.setdefault(name, []).append(version)
        if not wheel_fits(filename, target):
            found.append(f"{filename}: no tag of it fits {python}; pip refuses the whole install")
        if name in {normalized(n) for n in IMAGE_HAS}:
            found.append(f"{filename}: the GPU image has {name} already; it only adds bytes")
        if name in versions and versions[name] != version:
            found.append(f"{filename}: constraints.txt pins {name}=={versions[name]}")
    for name, found_versions in seen.items():
        if len(found_versions) > 1:
            listed = ", ".join(found_versions)
            found.append(f"{name}: {listed}: two versions, and pip refuses the whole install")
    found += [f"{n}: no wheel of it" for n in needed if normalized(n) not in seen]
    total = tree_bytes + sum(wheels.values())
    if total > LIMIT_BYTES:
        found.append(
            f"tree {tree_bytes / MIB:.1f} MiB + wheels {sum(wheels.values()) / MIB:.1f} MiB = "
            f"{total / MIB:.1f} MiB, over the {LIMIT_BYTES / MIB:.0f} MiB limit (a call carries "
            "64 MiB at most, less room for the tree to grow)"
        )
    return found


def tree_bytes(root: Path = ROOT, leave_out: Path | None = None) -> int:
    """Bytes of the tree a call carries: tracked and untracked-not-ignored files (``git ls-files
    -co --exclude-standard``), less any under ``leave_out`` (a wheelhouse counted on its own)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.decode()
    total = 0
    for name in filter(None, listed.split("\0")):
        path = root / name
        if leave_out is not None and path.resolve().is_relative_to(leave_out.resolve()):
            continue
        if path.is_symlink() or path.is_file():  # a tracked file deleted here travels not
            total += path.lstat().st_size
    return total


def sizes(wheelhouse: Path) -> dict[str, int]:
    """``{file name: bytes}`` of the wheels in ``wheelhouse``."""
    return {w.name: w.stat().st_size for w in sorted(wheelhouse.glob("*.whl"))}


def fetch(python: str, wheelhouse: Path, target: tuple[int, int] = TARGET) -> None:
    """The wheels of :data:`NEEDED` for CPython ``target`` into ``wheelhouse``, replacing the wheels
    there (a stale second version would fail the whole install). ``python`` runs pip."""
    version = f"{target[0]}.{target[1]}"
    platforms = [f"--platform={p}" for p in PLATFORMS]
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    binary = [n for n in NEEDED if n not in SOURCE_ONLY]
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as fresh:
        download = [*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "-d", fresh]
        target_python = [f"--python-version={version}", "--implementation=cp", *platforms]
        subprocess.run([*download, *target_python, *pinned(binary)], check=True)
        # Pure Python (py3-none-any), so the local Python may build it for any target.
        built = [*pip, "wheel", "-q", "--no-deps", "-w", fresh, *pinned(list(SOURCE_ONLY))]
        subprocess.run(built, check=True)
        wheelhouse.mkdir(parents=True, exist_ok=True)
        for stale in wheelhouse.glob("*.whl"):
            stale.unlink()
        for wheel in Path(fresh).glob("*.whl"):
            shutil.move(str(wheel), wheelhouse / wheel.name)


def report(wheelhouse: Path, target: tuple[int, int] = TARGET, root: Path = ROOT) -> list[str]:
    """Print the wheelhouse, its size with the tree's, and :func:`problems`; return those."""
    wheels = sizes(wheelhouse)
    tree = tree_bytes(root, leave_out=wheelhouse)
    for name, size in wheels.items():
        print(f"{size / MIB:7.2f} MiB  {name}")
    wheel_total = sum(wheels.values())
    print(
        f"wheels {wheel_total / MIB:.2f} MiB + tree {tree / MIB:.2f} MiB = "
        f"{(wheel_total + tree) / MIB:.2f} MiB (limit {LIMIT_BYTES / MIB:.0f} MiB: a call "
        "carries 64 MiB at most)"
    )
    found = problems(wheels, tree, target)
    for problem in found:
        print(f"problem: {problem}")
    return found
