"""What ``--help`` says, and what a mistyped setting is told.

Every config field carries its meaning as a comment where it is declared
(``harness/config/schema.py``, each algorithm's file); the help shows it beside the
field's value in the composition asked for, so ``algo=sac env=pendulum --help``
lists SAC's settings with the values that command would run with.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import io
import textwrap
import tokenize
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

CONF = Path(__file__).resolve().parents[2] / "conf"
# Included by other configs (presets, the tuned pairs), never chosen on the command line.
INTERNAL_GROUPS = ("common", "tuned")


def groups() -> dict[str, list[str]]:
    """Each config group the command line chooses from, and its options."""
    return {
        d.name: sorted(p.stem for p in d.glob("*.yaml"))
        for d in sorted(CONF.iterdir())
        if d.is_dir() and d.name not in INTERNAL_GROUPS
    }


@functools.cache
def _declared_comments(cls: type) -> dict[str, str]:
    """``field: comment`` for one class's own fields: the comment on the
    field's lines, else the comment lines right above it."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments = {
        token.start[0]: token.string.lstrip("#").strip()
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }
    lines = source.splitlines()
    standalone = {
        n for n in comments if lines[n - 1].lstrip().startswith("#")
    }  # not another field's trailing comment
    found = {}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        own = [
            comments[n]
            for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)
            if n in comments
        ]
        above: list[str] = []
        line = node.lineno - 1
        while line in standalone:
            above.insert(0, comments[line])
            line -= 1
        found[node.target.id] = " ".join(own or above)
    return found


def field_docs(cls: type) -> dict[str, str]:
    """Every field's description, inherited ones included."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update({name: doc for name, doc in _declared_comments(klass).items() if doc})
    return docs


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(_show(v) for v in value) + "]"
    return str(value)


def settings(cfg: DictConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """``(key, value, description)`` for every leaf of ``cfg``, unresolved
    (an ``${oc.env:...}`` secret stays a reference)."""
    kind = OmegaConf.get_type(cfg)
    docs = field_docs(kind) if kind is not None and dataclasses.is_dataclass(kind) else {}
    rows = []
    for key in cfg:
        node = cfg._get_node(key)
        name = f"{prefix}{key!s}"
        if isinstance(node, DictConfig):
            rows += settings(node, f"{name}.")
        else:
            if OmegaConf.is_list(node):
                value = OmegaConf.to_container(node, resolve=False)
            else:
                value = node._value()  # type: ignore[union-attr]
            rows.append((name, _show(value), docs.get(str(key), "")))
    return rows


def help_text(cfg: DictConfig, choices: dict[str, Any], usage: str) -> str:
    """The whole ``--help``: usage, the groups this config composes with the chosen options starred,
    every setting."""
    lines = [usage, "", "Groups (* chosen):"]
    for group, options in groups().items():
        if group not in choices:
            continue
        chosen = choices[group]
        lines.append(f"  {group:<11} " + "  ".join(f"{o}*" if o == chosen else o for o in options))
    lines += ["", "Settings (key=value; the values of this composition):"]
    rows = settings(cfg)
    width = max(len(f"{key}={value}") for key, value, _ in rows) + 2
    lines += [f"  {f'{key}={value}':<{width}}{doc}".rstrip() for key, value, doc in rows]
    return "\n".join(lines)


def _nearest(word: str, candidates: list[str]) -> str | None:
    close = difflib.get_close_matches(word, candidates, n=1)
    return close[0] if close else None


def unknown_setting(full_key: str, owner: type | None) -> str:
    """``algo.lrr``: the setting does not exist; the nearest one that does."""
    section, _, name = full_key.rpartition(".")
    fields = (
        [f.name for f in dataclasses.fields(owner)]
        if owner is not None and dataclasses.is_dataclass(owner)
        else []
    )
    near = _nearest(name, fields)
    hint = f"; did you mean {section + '.' if section else ''}{near}?" if near else "."
    where = f" in {section}" if section else ""
    return f"{full_key}: no such setting{where}{hint} (--help lists every setting)"


def unknown_option(group: str, option: str) -> str:
    """``algo=nope``: the options there are."""
    options = groups().get(group, [])
    near = _nearest(option, options)
    hint = f"; did you mean {group}={near}?" if near else "."
    return f"{group}={option}: no such option{hint} Choose one of: {', '.join(options)}"
