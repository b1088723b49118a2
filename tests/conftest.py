"""Fixtures, and the test tiers: every test carries exactly one tier marker
(``unit``, ``multiprocess``, ``e2e``, ``slurm``, ``gpu``), and ``slow`` on top
for learning checks. Run one tier with ``scripts/test.sh -m <tier>``."""

from __future__ import annotations

import pytest

TIERS = ("unit", "multiprocess", "e2e", "slurm", "gpu")


def pytest_collection_modifyitems(config, items):
    untiered = [
        item.nodeid
        for item in items
        if sum(item.get_closest_marker(t) is not None for t in TIERS) != 1
    ]
    if untiered:
        raise pytest.UsageError(f"tests need exactly one tier marker of {TIERS}: {untiered[:10]}")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Runs happen in a temporary directory (MuJoCo and runs/ write into the cwd)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
