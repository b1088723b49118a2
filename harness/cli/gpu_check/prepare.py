"""``harness gpu-check``: the harness on a GPU as its users run it, in one table (docs/gpu.md).

    harness gpu-check [--out DIR]       # on a GPU machine: its steps' budgets add up to 470 s
    harness gpu-check --dry-run         # every step on the CPU: proves the check without a GPU
    harness gpu-check --fetch-wheels    # with internet: the wheels a GPU image lacks, into .whl/,
                                        # for its CPython 3.12 on x86_64, checked before a lease
    harness gpu-check --rehearse        # with internet: that install offline, and a dry run, here
    python3 -m harness gpu-check        # in the checkout, with a GPU image's own Python

0. the GPU test tier (``pytest tests/devices -m gpu``);
1. ``harness.train`` through torchrun, the trainer on CUDA and 2 CPU collectors: PPO CartPole and
   SAC Pendulum, short budgets, ``sync=gloo``, ``shm``, ``hierarchical``; PPO on Atari Breakout
   (the Nature CNN, compiled: an untimed warm-up launch compiles it first), ``sync=gloo``;
2. ``sync=nccl`` with GPU collectors when the machine has a GPU per rank (else skipped, saying so);
3. ``benchmarks/update.py`` on CUDA (eager, compiled, amp) for every algorithm, the CPU's beside
   it;
4. ``benchmarks/weight_sync.py`` with a CUDA publisher: a 10M-parameter policy to CPU collectors
   against a plain device-to-host copy of the same bytes.

Which Python runs them: ``$PYTHON`` if set; else the first of this one, ``.venv/bin/python`` and
``python3`` whose torch sees a GPU (a GPU image's own CUDA torch: a machine without internet
cannot install one); ``--dry-run``: this one. What that Python lacks of the harness's dependencies
(tensordict, hydra-core, omegaconf, gymnasium, ...) is installed with ``pip --target`` into
``$SITE`` (default /tmp/harness-gpu-site), from the wheels in ``$WHEELHOUSE`` (default .whl/)
without the network, else from the package index. Without a GPU (and without ``--dry-run``) it
says what it skipped and exits 0. Only the standard library here: the chosen Python may lack
everything else.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness.cli.gpu_check.wheelhouse import NEEDED, fetch, pinned, report
from harness.cli.usage import Parser, UsageError

ROOT = Path(__file__).resolve().parents[3]  # the checkout, whose tests/ and benchmarks/ it runs
MODULES = ("tensordict", "hydra", "omegaconf", "gymnasium")
DRY_RUN_MODULES = ("pytest", "ale_py")  # the test tier; ppo_atari's Breakout
SKIPPED = (
    "0 the GPU test tier, 1 the torchrun runs with a CUDA trainer, 2 sync=nccl, 3 the CUDA update "
    "benchmark, 4 the CUDA weight sync benchmark"
)


def parser() -> Parser:
    p = Parser(prog="harness gpu-check", description=__doc__)
    p.add_argument(
        "--out", metavar="DIR", help="where the table, its JSON and the logs go (default: runs/...)"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="every step on the CPU, to prove the check"
    )
    p.add_argument(
        "--fetch-wheels",
        action="store_true",
        help="with internet: download the wheels a GPU image lacks into $WHEELHOUSE (.whl/)",
    )
    p.add_argument(
        "--rehearse",
        action="store_true",
        help="with internet, on the CPU: the GPU machine's offline install and a dry run, in a "
        "fresh venv with only torch and the GPU image's packages (docs/gpu.md)",
    )
    return p


def main(argv: list[str]) -> int:
    """``harness gpu-check``: choose the Python, give it the harness's dependencies, run the check
    there (:mod:`harness.cli.gpu_check.run`)."""
    args = parser().parse_args(argv)
    if not (ROOT / "benchmarks").is_dir() or not (ROOT / "tests" / "devices").is_dir():
        raise UsageError(
            f"the GPU check runs the checkout's tests/ and benchmarks/, and {ROOT} has none: run "
            "it from a clone (pip install -e .)"
        )
    wheelhouse = Path(os.environ.get("WHEELHOUSE", ROOT / ".whl"))
    if args.fetch_wheels:
        return fetch_wheels(os.environ.get("PYTHON", sys.executable), wheelhouse)
    if args.rehearse:
        from harness.cli.gpu_check.rehearse import rehearse  # needs packaging, as pip does

        return rehearse(args.out)
    python = choose_python(args.dry_run)
    if python is None:
        print(
            "gpu_check: no Python here has a torch that sees a GPU (this one, .venv/bin/python, "
            f"python3), so nothing was checked. Skipped: {SKIPPED}. On a GPU machine: "
            "PYTHON=<a python with CUDA torch>; here: harness gpu-check --dry-run runs every step "
            "on the CPU."
        )
        return 0
    paths = [str(ROOT)]
    if lacking := missing(python, MODULES):
        site = Path(os.environ.get("SITE", "/tmp/harness-gpu-site"))
        print(
            f"gpu_check: {python} lacks {' '.join(lacking)}; installing into {site}",
            file=sys.stderr,
        )
        if not install(python, site, wheelhouse):
            return 2
        paths.append(str(site))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    # With what was just installed on its path: ale-py comes from the wheelhouse.
    if args.dry_run and (lacking := missing(python, DRY_RUN_MODULES, env)):
        raise SystemExit(
            f"error: the dry run needs {' and '.join(lacking)} (the test tier, Atari): "
            "pip install -e '.[test,atari]'"
        )
    version = "import torch; print(torch.__version__, 'cuda', torch.version.cuda)"
    found = subprocess.run([python, "-c", version], env=env, capture_output=True, text=True)
    print(f"gpu_check: {python}, torch {found.stdout.strip()}", file=sys.stderr, flush=True)
    passed = [*(["--out", args.out] if args.out else []), *(["--dry-run"] if args.dry_run else [])]
    command = [python, "-m", "harness.cli.gpu_check.run", *passed]
    os.execve(python, command, env)


def choose_python(dry_run: bool) -> str | None:
    """``$PYTHON``; this Python for a dry run; else the first whose torch sees a GPU."""
    if os.environ.get("PYTHON"):
        return os.environ["PYTHON"]
    if dry_run:
        return sys.executable
    candidates = [sys.executable, str(ROOT / ".venv" / "bin" / "python"), shutil.which("python3")]
    for candidate in dict.fromkeys(filter(None, candidates)):
        if Path(candidate).exists() and sees_gpu(candidate):
            return candidate
    return None


def sees_gpu(python: str) -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([python, "-c", probe], capture_output=True).returncode == 0


def missing(python: str, modules: tuple[str, ...], env: dict[str, str] | None = None) -> list[str]:
    """Which of ``modules`` ``python`` cannot import (in ``env``, else this environment)."""
    probe = (
        "import importlib.util, sys\n"
        "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    )
    found = subprocess.run([python, "-c", probe, *modules], capture_output=True, text=True, env=env)
    return found.stdout.split()


def install(python: str, site: Path, wheelhouse: Path) -> bool:
    """:data:`NEEDED` into ``site``, from ``wheelhouse`` if it holds wheels, else from the index."""
    site.mkdir(parents=True, exist_ok=True)
    # --upgrade: a folder left by an earlier install would otherwise keep its old versions.
    pip = [python, "-m", "pip", "install", "-q", "--no-deps", "--upgrade"]
    pip += ["--disable-pip-version-check"]
    wheels = sorted(str(w) for w in wheelhouse.glob("*.whl"))
    if wheels:
        command = [*pip, "--no-index", "--no-compile", "--target", str(site), *wheels]
    else:  # a machine with an index may lack what the GPU image has: OpenCV for ppo_atari
        command = [*pip, "--target", str(site), *pinned([*NEEDED, "opencv-python-headless"])]
    if subprocess.run(command).returncode == 0:
        return True
    print(
        f"gpu_check: could not install {' '.join(pinned(NEEDED))} (no network?). On a machine with "
        "internet run harness gpu-check --fetch-wheels, carry .whl/ here, and run this again.",
        file=sys.stderr,
    )
    return False


def fetch_wheels(python: str, wheelhouse: Path) -> int:
    """The wheels of :data:`NEEDED` for the GPU image's Python into ``wheelhouse``, checked
    (:func:`harness.cli.gpu_check.wheelhouse.problems`) before they are carried."""
    fetch(python, wheelhouse)
    if report(wheelhouse):
        print("gpu_check: the wheelhouse above would fail on the GPU machine", file=sys.stderr)
        return 1
    print(f"carry {wheelhouse} to the GPU machine; harness gpu-check installs from it offline")
    return 0
