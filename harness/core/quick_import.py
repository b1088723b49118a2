"""Import tensordict without loading torch's compiler front end (``torch._dynamo``).

tensordict marks a few of its functions for ``torch.compile`` while it is imported
(``torch.compiler.allow_in_graph`` and ``assume_constant_result``), and each mark imports
``torch._dynamo``: 1.2-1.7 s of CPU at every process's start (measured on this project's 2-core
machine with torch 2.13 and tensordict 0.15, 2026-12-07), paid by every rank, worker and tool,
though a run compiles nothing unless ``algo.compile`` asks. While tensordict is imported, the two
marks are swapped for ones that do the same later: ``assume_constant_result`` only sets an
attribute, so it is done at once; ``allow_in_graph`` is kept in a list and applied by
:func:`mark_for_compile`, which :mod:`harness.algos.base` calls before its first
``torch.compile``, and at once by any mark made after ``torch._dynamo`` is loaded. Both return the
function they are given, as torch's do, so nothing but the time changes. (Code outside the harness
that compiles tensordict's functions calls :func:`mark_for_compile` first.)
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

_deferred: list[Callable] = []  # tensordict's functions waiting for ``allow_in_graph``


def _allow_in_graph_later(fn: Any) -> Any:
    if "torch._dynamo" in sys.modules:
        import torch._dynamo

        return torch._dynamo.allow_in_graph(fn)
    _deferred.extend(fn if isinstance(fn, (list, tuple)) else [fn])
    return fn


def _assume_constant_result(fn: Any) -> Any:
    fn._dynamo_marked_constant = True  # what torch._dynamo.assume_constant_result does
    return fn


def mark_for_compile() -> None:
    """Apply the ``allow_in_graph`` marks held back while tensordict was imported."""
    import torch._dynamo

    while _deferred:
        torch._dynamo.allow_in_graph(_deferred.pop())


class _Loader(importlib.abc.Loader):
    """tensordict's own loader, run with the two marks swapped."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> Any:  # resource readers and the like: tensordict's own
        return getattr(self.loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        import torch.compiler

        marks = torch.compiler.allow_in_graph, torch.compiler.assume_constant_result
        torch.compiler.allow_in_graph = _allow_in_graph_later
        torch.compiler.assume_constant_result = _assume_constant_result
        try:
            self.loader.exec_module(module)
        finally:
            torch.compiler.allow_in_graph, torch.compiler.assume_constant_result = marks


class _Finder(importlib.abc.MetaPathFinder):
    """Finds tensordict as Python's own path finder would, and hands back its spec with
    :class:`_Loader`; anything else, or a tensordict found some other way, it leaves alone."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "tensordict":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Make the first ``import tensordict`` of this process skip ``torch._dynamo``."""
    if "tensordict" not in sys.modules and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
