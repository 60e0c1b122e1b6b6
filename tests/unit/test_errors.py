"""One exception hierarchy (streams/errors.py), and the one dotted-path import (plugins)."""

from __future__ import annotations

import ast
import importlib

import pytest

from streams.errors import AgentContextError, ConfigurationError, stop_on_configuration_error
from streams.plugins import resolve
from tests.support.workers import ROOT


def test_a_configuration_error_is_an_exception_that_entry_points_turn_into_one_line() -> None:
    assert issubclass(ConfigurationError, AgentContextError)
    assert not issubclass(ConfigurationError, SystemExit)  # ``except Exception`` sees it
    with pytest.raises(SystemExit) as stopped, stop_on_configuration_error():
        raise ConfigurationError("invalid setting AC_X: no")
    assert stopped.value.code == "invalid setting AC_X: no"  # printed alone, exit status 1


def test_every_project_exception_derives_from_the_one_base() -> None:
    outside = []
    for package in ("schemas", "streams", "agents", "sinks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(
                ".__init__"
            )
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.ClassDef):
                    continue
                if not any(ast.unparse(b).endswith(("Error", "Exception")) for b in node.bases):
                    continue
                cls = getattr(importlib.import_module(module), node.name)
                if issubclass(cls, BaseException) and not issubclass(cls, AgentContextError):
                    outside.append(f"{module}.{node.name}")
    assert not outside, outside


@pytest.mark.parametrize(
    ("dotted", "message"),
    [
        ("no_such_module_xyz:fn", "AC_X: cannot import 'no_such_module_xyz:fn': No module"),
        ("streams.plugins:missing", "AC_X: 'streams.plugins:missing' not found: module"),
    ],
)
def test_a_dotted_path_that_does_not_resolve_is_one_line_naming_the_setting(
    dotted: str, message: str
) -> None:
    assert resolve("streams.plugins:resolve") is resolve
    with pytest.raises(ConfigurationError) as refused:
        resolve(dotted, "AC_X")
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)
