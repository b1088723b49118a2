"""The import graph of ``harness/``: no cycles, and no import from a lower layer up.

Layers, lowest first: the lower one (packing, specs, checkpoint, metrics,
distributed) imports nothing of the two above it; the middle one (sync, data,
collect, algos) may import the lower one and itself, without cycles; the
upper one (config, roles, train and other entry points) may import anything
below it. Module-level and function-level imports both count, and so do
imports under ``if TYPE_CHECKING:``: a cycle that only type checkers follow
is still two modules that cannot be read apart.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "harness"
LOWER = ("harness.core", "harness.metrics", "harness.distributed")
MIDDLE = ("harness.sync", "harness.data", "harness.collect", "harness.algos")
LAYER_NAMES = {0: "lower", 1: "middle", 2: "upper"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def layer(module: str) -> int:
    def within(prefixes: tuple[str, ...]) -> bool:
        return any(module == p or module.startswith(p + ".") for p in prefixes)

    return 0 if within(LOWER) else 1 if within(MIDDLE) else 2


def imported_names(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, int]]:
    """``(dotted name, line)`` of every import, wherever it stands (type-only ones too);
    ``from a import b`` gives ``a.b``, a module or a name in ``a``."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found.extend((f"{base}.{alias.name}", node.lineno) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """``{module: {imported harness module: line}}``; ``from a import b``
    counts as an import of ``a.b`` when that is a module, else of ``a``."""
    known = modules()
    graph: dict[str, dict[str, int]] = {}
    for module, path in known.items():
        edges: dict[str, int] = {}
        names = imported_names(
            ast.parse(path.read_text(), str(path)), module, path.name == "__init__.py"
        )
        for name, line in names:
            target = name if name in known else name.rpartition(".")[0]
            if target in known and target != module:
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle ``[a, b, ..., a]`` through each group of modules that import
    each other (each strongly connected component of two or more)."""
    found: list[list[str]] = []
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        cycle = _cycle_from(start, graph)
        if cycle:
            found.append(cycle)
            done.update(_reachable(start, graph) & _reaching(start, graph))
    return found


def _cycle_from(start: str, graph: dict[str, dict[str, int]]) -> list[str] | None:
    """The shortest path from ``start`` back to itself (breadth first)."""
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for target in sorted(graph.get(node, {})):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if target not in parents:
                    parents[target] = node
                    nxt.append(target)
        frontier = nxt
    return None


def _reachable(start: str, graph: dict[str, dict[str, int]]) -> set[str]:
    seen, stack = {start}, [start]
    while stack:
        for target in graph.get(stack.pop(), {}):
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return seen


def _reaching(start: str, graph: dict[str, dict[str, int]]) -> set[str]:
    reverse: dict[str, dict[str, int]] = {}
    for module, edges in graph.items():
        for target in edges:
            reverse.setdefault(target, {})[module] = 0
    return _reachable(start, reverse)


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    return [
        f"{module} ({LAYER_NAMES[layer(module)]}, line {line}) "
        f"imports {target} ({LAYER_NAMES[layer(target)]})"
        for module, edges in sorted(graph.items())
        for target, line in sorted(edges.items())
        if layer(target) > layer(module)
    ]


def test_the_graph_sees_function_level_and_type_checking_imports():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from harness.config import Config\n"
        "def f():\n    from harness.sync import SCHEMES\n"
    )
    names = [name for name, _ in imported_names(tree, "harness.core.packing", False)]
    assert "harness.sync.SCHEMES" in names and "harness.config.Config" in names


def test_harness_has_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_layer_imports_one_above_it():
    upward = upward_imports(import_graph())
    assert not upward, "imports from a lower layer up:\n" + "\n".join(upward)


# Counted after `ruff format` at 100 columns (CONTRIBUTING.md says why these numbers).
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60
# A module this close to the limit says why in its first comment, which starts with this:
# a limit kept by squeezing the last lines in is not kept.
NEAR_LIMIT, SIZE_NOTE = 5, "# Size:"


def first_comment(source: str) -> str:
    return next((line.strip() for line in source.splitlines() if line.lstrip().startswith("#")), "")


def test_modules_and_functions_stay_small_enough_to_read():
    too_long = []
    for module, path in modules().items():
        source = path.read_text()
        lines = source.count("\n")
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{module}: {lines} lines (at most {MAX_MODULE_LINES})")
        elif lines > MAX_MODULE_LINES - NEAR_LIMIT and not first_comment(source).startswith(
            SIZE_NOTE
        ):
            too_long.append(
                f"{module}: {lines} lines, within {NEAR_LIMIT} of the limit: split it, or say why "
                f"it holds together in a first comment starting {SIZE_NOTE!r}"
            )
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(
                        f"{module}.{node.name} (line {node.lineno}): {length} lines "
                        f"(at most {MAX_FUNCTION_LINES})"
                    )
    assert not too_long, "split these:\n" + "\n".join(too_long)


def test_the_size_rule_sees_a_module_packed_to_the_limit():
    packed = "x = 1\n" * (MAX_MODULE_LINES - 1)
    assert packed.count("\n") > MAX_MODULE_LINES - NEAR_LIMIT
    assert not first_comment(packed).startswith(SIZE_NOTE)
    assert first_comment("# Size: one table\n" + packed).startswith(SIZE_NOTE)


# The top level reads as a table of contents: folders, and at most this many modules.
MAX_TOP_LEVEL_MODULES = 5


def test_the_top_level_holds_folders_and_few_modules():
    loose = sorted(p.name for p in (ROOT / PACKAGE).glob("*.py"))
    assert len(loose) <= MAX_TOP_LEVEL_MODULES, f"modules at harness/'s top: {loose}"


def test_the_package_never_imports_its_test_scaffolding():
    found = [
        f"{module} imports {target} (line {line})"
        for module, edges in import_graph().items()
        if not module.startswith("harness.testing")
        for target, line in edges.items()
        if target == "harness.testing" or target.startswith("harness.testing.")
    ]
    assert not found, "harness.testing is for tests and benchmarks only:\n" + "\n".join(found)


def test_importing_the_harness_plots_nothing_and_leaves_signals_alone():
    """A program that imports the harness keeps its own signal handlers, and pays for no
    plotting library: matplotlib is the ``plot`` extra's, imported by the verbs that plot."""
    probe = (
        "import signal, sys\n"
        # As while `python -m harness.<module>` imports the package: the old hook's cue.
        "sys.argv[:] = ['-m']\n"
        "names = ('SIGINT', 'SIGTERM', 'SIGUSR1', 'SIGHUP')\n"
        "before = [signal.getsignal(getattr(signal, n)) for n in names]\n"
        "import harness, harness.train\n"
        "after = [signal.getsignal(getattr(signal, n)) for n in names]\n"
        "changed = [n for n, b, a in zip(names, before, after) if a is not b]\n"
        "plots = sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib')[:3]\n"
        "print(changed, plots)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[] []", f"(changed handlers, matplotlib modules): {out.stdout}"


@pytest.mark.parametrize(
    "command",
    [["check", "--output-format", "concise"], ["format", "--check"]],
    ids=["lint", "format"],
)
def test_ruff_finds_nothing_to_fix(command):
    # The rules are pyproject.toml's [tool.ruff]; ruff comes with the test extra. Fix with `ruff
    # check --fix` / `ruff format`.
    ruff = Path(sys.executable).parent / "ruff"
    out = subprocess.run(
        [str(ruff), *command, "--no-cache", str(ROOT)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-1000:]


def test_no_two_packages_import_each_other():
    """Rooms, not just modules, stay apart: ``algos`` and ``collect`` once did (``EnvSpec`` now
    lives below both)."""

    def room(module: str) -> str:
        return ".".join(module.split(".")[:2])

    between: dict[str, set[str]] = {}
    for module, edges in import_graph().items():
        between.setdefault(room(module), set()).update(
            room(t) for t in edges if room(t) != room(module)
        )
    both = sorted(
        {
            tuple(sorted((a, b)))
            for a, rooms in between.items()
            for b in rooms
            if a in between.get(b, set())
        }
    )
    assert not both, f"packages that import each other: {both}"


# Which kind of run this is (online or offline) is asked in one place: the two kinds.
RUN_KINDS = "harness.roles.kinds"


def asks_the_run_kind(tree: ast.AST) -> list[int]:
    """Lines that read or take the ``offline`` flag: ``x.offline``, or an argument ``offline``."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if (isinstance(node, ast.Attribute) and node.attr == "offline")
        or (isinstance(node, ast.arg) and node.arg == "offline")
    ]


def test_only_the_run_kinds_ask_whether_a_run_is_offline():
    """``algos/`` declares the flag (``Algorithm.offline``); ``roles/kinds.py`` reads it, once,
    to choose the run's kind; everything else asks the kind."""
    found = [
        f"{module}:{line}"
        for module, path in modules().items()
        if module != RUN_KINDS and not module.startswith("harness.algos")
        for line in asks_the_run_kind(ast.parse(path.read_text()))
    ]
    assert not found, "the offline flag read outside the run kinds:\n" + "\n".join(found)


def test_the_run_kind_check_sees_the_flag():
    assert asks_the_run_kind(ast.parse("if algo.offline:\n    pass\n")) == [1]
    assert asks_the_run_kind(ast.parse("def f(offline: bool): ...\n")) == [1]
    assert (
        asks_the_run_kind(ast.parse("unit = 'offline'\nfrom harness.algos import offline\n")) == []
    )


MAX_TRAINER_ATTRIBUTES = 12  # what a trainer holds, grouped: a reader keeps it in mind at once


def instance_attributes(cls: ast.ClassDef) -> set[str]:
    """Every ``self.<name>`` that a method of ``cls`` assigns (``self.a.b = ...`` sets ``a``'s)."""
    names = set()
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        while targets:
            target = targets.pop()
            if isinstance(target, ast.Tuple):
                targets.extend(target.elts)
            elif isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self":
                names.add(target.attr)
    return names


def test_the_trainer_holds_few_attributes():
    tree = ast.parse((ROOT / "harness/roles/trainer.py").read_text())
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    held = sorted(instance_attributes(trainer))
    assert len(held) <= MAX_TRAINER_ATTRIBUTES, f"Trainer holds {len(held)}: {held}"
    probe = "class A:\n    def f(self):\n        self.a, self.b = 1, 2\n        self.a.c += 1\n"
    assert instance_attributes(cast(ast.ClassDef, ast.parse(probe).body[0])) == {"a", "b"}
