"""The wheelhouse carried to the GPU machine (CPython 3.12, x86_64 Linux, no package index): the
static check of its wheels' tags, versions and size, on made-up file names and on the real .whl/
when there is one (harness gpu-check --fetch-wheels; docs/gpu.md)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from helpers import ROOT

from harness.cli.gpu_check import wheelhouse
from harness.cli.gpu_check.wheelhouse import LIMIT_BYTES, problems, tree_bytes, wheel_fits

pytestmark = pytest.mark.unit
KIB = 1024
# The pins the made-up wheelhouse is checked against (not constraints.txt: these tests fix them).
PINS = {"tensordict": "0.15.3", "ale-py": "0.12.1", "hydra-core": "1.3.8", "numpy": "2.4.6"}
NEEDED = ("tensordict", "ale-py", "hydra-core")
GOOD = {
    "tensordict-0.15.3-py3-none-any.whl": 800 * KIB,
    "ale_py-0.12.1-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl": 3000 * KIB,
    "hydra_core-1.3.8-py3-none-any.whl": 160 * KIB,
}


@pytest.mark.parametrize(
    "filename",
    [
        "tensordict-0.15.3-py3-none-any.whl",
        "farama_notifications-0.0.6-py3-none-any.whl",
        "six-1.17.0-py2.py3-none-any.whl",  # a compressed tag set: one fitting tag is enough
        "typing_inspect-0.9.0-py312-none-any.whl",
        "attrs-1.0-py38-none-any.whl",
        "ale_py-0.12.1-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "cryptography-44.0.0-cp39-abi3-manylinux_2_28_x86_64.whl",  # the stable ABI, from 3.9 on
        "pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "old-1.0-cp312-cp312-manylinux1_x86_64.whl",
        "local-1.0-cp312-cp312-linux_x86_64.whl",
        "bare-1.0-cp312-none-any.whl",
        "built-1.0-1-py3-none-any.whl",  # with a build number
    ],
)
def test_a_wheel_cpython_3_12_on_x86_64_linux_takes_fits(filename):
    assert wheel_fits(filename, (3, 12))


@pytest.mark.parametrize(
    "filename",
    [
        "ale_py-0.12.1-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",  # 3.11's
        "ale_py-0.12.1-cp313-cp313-manylinux_2_28_x86_64.whl",
        "ale_py-0.12.1-cp312-cp312-manylinux_2_28_aarch64.whl",  # an Arm machine's
        "ale_py-0.12.1-cp312-cp312-macosx_11_0_arm64.whl",
        "ale_py-0.12.1-cp312-cp312-win_amd64.whl",
        "ale_py-0.12.1-cp312-cp312-musllinux_1_2_x86_64.whl",  # musl, not glibc
        "future-1.0-cp312-cp312-manylinux_2_40_x86_64.whl",  # newer than the image's glibc
        "newer-1.0-cp313-abi3-manylinux_2_28_x86_64.whl",  # the stable ABI from 3.13 on
        "debug-1.0-cp312-cp312d-manylinux_2_28_x86_64.whl",
        "py2only-1.0-py2-none-any.whl",
        "pypy-1.0-pp310-pypy310_pp73-manylinux_2_28_x86_64.whl",
        "cp311only-1.0-cp311-none-any.whl",
        "not-a-wheel.tar.gz",
    ],
)
def test_a_wheel_cpython_3_12_on_x86_64_linux_refuses_does_not_fit(filename):
    assert not wheel_fits(filename, (3, 12))


def test_the_same_check_serves_the_local_python_for_the_rehearsal():
    cp311 = "ale_py-0.12.1-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
    cp312 = "ale_py-0.12.1-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
    assert wheel_fits(cp311, (3, 11)) and not wheel_fits(cp312, (3, 11))


def check(wheels: dict[str, int], tree: int = 3 * 2**20) -> list[str]:
    return problems(wheels, tree, (3, 12), needed=NEEDED, versions=PINS)


def test_a_wheelhouse_of_fitting_pinned_wheels_within_the_limit_has_no_problem():
    assert check(GOOD) == []


def test_a_wheel_for_another_python_is_named_as_failing_the_whole_install():
    wrong = "ale_py-0.12.1-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
    wheels = {**{n: s for n, s in GOOD.items() if not n.startswith("ale")}, wrong: 3000 * KIB}
    assert check(wheels) == [
        f"{wrong}: no tag of it fits CPython 3.12 on x86_64 Linux; pip refuses the whole install"
    ]


def test_a_package_the_gpu_image_has_is_named_as_bytes_to_leave_behind():
    opencv = "opencv_python_headless-5.1.0.95-cp37-abi3-manylinux_2_28_x86_64.whl"
    found = check({**GOOD, opencv: 61 * 2**20})
    assert found == [
        f"{opencv}: the GPU image has opencv-python-headless already; it only adds bytes",
        "tree 3.0 MiB + wheels 64.9 MiB = 67.9 MiB, over the 56 MiB limit (a call carries "
        "64 MiB at most, less room for the tree to grow)",
    ]


def test_two_versions_of_one_package_and_a_version_off_its_pin_are_named():
    second = "tensordict-0.10.0-py3-none-any.whl"
    found = check({**GOOD, second: 700 * KIB})
    assert f"{second}: constraints.txt pins tensordict==0.15.3" in found
    assert "tensordict: 0.10.0, 0.15.3: two versions, and pip refuses the whole install" in found
    assert len(found) == 2


def test_a_needed_package_without_a_wheel_is_named():
    wheels = {n: s for n, s in GOOD.items() if not n.startswith("hydra")}
    assert check(wheels) == ["hydra-core: no wheel of it"]


def test_tree_and_wheels_together_must_stay_under_56_mib():
    wheels_bytes = sum(GOOD.values())
    assert check(GOOD, tree=LIMIT_BYTES - wheels_bytes) == []  # exactly at the limit: carried
    assert check(GOOD, tree=LIMIT_BYTES - wheels_bytes + 1) != []
    assert LIMIT_BYTES == 56 * 2**20


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed here")
def test_the_tree_counts_tracked_and_untracked_files_but_not_ignored_ones(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_bytes(b"runs/\n")  # 6 bytes, untracked and not ignored
    (tmp_path / "tracked.py").write_bytes(b"x" * 1000)
    (tmp_path / "new.py").write_bytes(b"y" * 300)  # untracked, not ignored: it travels
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "big.bin").write_bytes(b"z" * 50_000)  # ignored: stays behind
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "a.whl").write_bytes(b"w" * 7000)  # counted as wheels, not as tree
    subprocess.run(["git", "add", "tracked.py"], cwd=tmp_path, check=True)
    assert tree_bytes(tmp_path) == 6 + 1000 + 300 + 7000
    assert tree_bytes(tmp_path, leave_out=tmp_path / "wheels") == 6 + 1000 + 300


def test_the_real_wheelhouse_fits_the_gpu_machine():
    """The .whl/ that `harness gpu-check --fetch-wheels` made, if this checkout has one."""
    found = ROOT / ".whl"
    if not any(found.glob("*.whl")):
        pytest.skip(f"no wheels in {found}: `harness gpu-check --fetch-wheels` makes them")
    wheels = wheelhouse.sizes(found)
    assert problems(wheels, tree_bytes(ROOT, leave_out=found)) == []
