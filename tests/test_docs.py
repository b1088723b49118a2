"""The docs name what exists: every repository path, module and link in README.md, CONTRIBUTING.md
and docs/*.md."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from helpers import ROOT

pytestmark = pytest.mark.unit
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
# Where a path in a doc starts when it names a file of this repository (runs/ and datasets/ are what
# runs write).
TOP = ("harness/", "conf/", "scripts/", "tests/", "slurm/", "benchmarks/", "docs/", ".ci/")
FILES = (
    "pyproject.toml",
    "constraints.txt",
    "README.md",
    "CONTRIBUTING.md",
    ".pre-commit-config.yaml",
)
PLACEHOLDER = re.compile(r"[<>{}$]|\.\.\.|…")


def code_spans(text: str) -> list[str]:
    """The words of every `code span` and ``` block."""
    spans = re.findall(r"```[a-z]*\n(.*?)```", text, re.S) + re.findall(
        r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S)
    )
    return [word for span in spans for word in re.split(r"[\s=\[\],()'\"]+", span)]


def named_paths(doc: Path) -> set[str]:
    words = {w.rstrip(".:;") for w in code_spans(doc.read_text())}
    return {
        w.split("::")[0]
        for w in words
        if (w.startswith(TOP) or w in FILES) and not PLACEHOLDER.search(w)
    }


def named_modules(doc: Path) -> set[str]:
    return {
        m
        for m in re.findall(r"\bharness(?:\.[a-z_]+)+", doc.read_text())
        if not m.endswith((".py", ".md"))
    }


def links(doc: Path) -> set[str]:
    return {
        t.split("#")[0]
        for t in re.findall(r"\]\(([^)\s]+)\)", doc.read_text())
        if not t.startswith(("http", "mailto:", "#"))
    }


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_path_module_and_link_a_doc_names_exists(doc):
    missing = [p for p in sorted(named_paths(doc)) if not any(ROOT.glob(p.rstrip("/")))]
    missing += [m for m in sorted(named_modules(doc)) if not _module_or_attr(m)]
    missing += [t for t in sorted(links(doc)) if not (doc.parent / t).exists()]
    assert missing == [], f"{doc.relative_to(ROOT)} names what does not exist: {missing}"


def _module_or_attr(name: str) -> bool:
    """``harness.a.b``: a module, or a module followed by names defined in it."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for attr in parts[end:]:
            if not hasattr(found, attr):
                return False
            found = getattr(found, attr)
        return True
    return False


def test_a_missing_path_module_or_link_is_found(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "Run `python -m harness.dataset` or `harness/dataset.py`, see [there](nowhere.md);\n"
        "```bash\nscripts/plot.py runs/<name> --out runs/<name>/curves.png\n```\n"
    )
    assert named_paths(doc) == {
        "harness/dataset.py",
        "scripts/plot.py",
    }  # runs/<name>: what a run writes
    assert not any(ROOT.glob("harness/dataset.py")) and not _module_or_attr("harness.dataset")
    assert _module_or_attr("harness.cli.launch.main") and _module_or_attr(
        "harness.testing.spawn.run_ranks"
    )
    assert links(doc) == {"nowhere.md"}
