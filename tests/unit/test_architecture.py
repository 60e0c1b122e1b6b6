"""Faust's internals are touched only in ``streams/_faust`` (import-linter checks the
layers; it cannot see private attributes, nor tell ``faust.web`` from ``faust.stores``)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import faust

ROOT = Path(__file__).resolve().parents[2]
FENCE = ROOT / "streams" / "_faust"
# Faust's public API as these workers use it: the top level, its types and its web views.
PUBLIC_FAUST = {"faust", "faust.types", "faust.web"}


def _sources() -> Iterator[Path]:
    for package in ("schemas", "streams", "agents", "sinks", "scripts"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if FENCE not in path.parents:
                yield path


def _faust_private_names() -> set[str]:
    """Names Faust defines with a leading underscore (methods and attributes)."""
    names: set[str] = set()
    pattern = re.compile(r"(?:def |self\.)(_[a-z]\w*)")
    for path in Path(faust.__file__).parent.rglob("*.py"):
        names.update(pattern.findall(path.read_text(encoding="utf-8")))
    return names


def _own_private_names(trees: dict[Path, ast.Module]) -> set[str]:
    """Private names the project defines itself (``def _x``, ``self._x = ...``)."""
    own: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                own.add(node.target.id)
    return own


def test_only_streams_faust_imports_faust_internals() -> None:
    offenders = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                if name.split(".")[0] in ("faust", "mode") and name not in PUBLIC_FAUST:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not offenders, offenders


def test_only_streams_faust_uses_faust_private_members() -> None:
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in _sources()}
    faust_only = _faust_private_names() - _own_private_names(trees)
    offenders = [
        f"{path.relative_to(ROOT)}:{node.lineno} uses {node.attr}"
        for path, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in faust_only
    ]
    assert not offenders, offenders


def test_only_streams_faust_overrides_faust_private_methods() -> None:
    private = _faust_private_names()
    offenders = [
        f"{path.relative_to(ROOT)}:{method.lineno} {cls.name}.{method.name}"
        for path in _sources()
        for cls in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(cls, ast.ClassDef) and cls.bases
        for method in cls.body
        if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef) and method.name in private
    ]
    assert not offenders, offenders
