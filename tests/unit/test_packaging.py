"""Packaging: the project installs without deprecation warnings that will become errors."""

from __future__ import annotations

import tomllib

from tests.support.workers import ROOT


def test_the_license_is_an_spdx_expression_the_build_backend_understands() -> None:
    """The table form printed a setuptools deprecation warning on every install (issue 21):
    builds that keep it stop working after 2027-02-18."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["license"] == "Apache-2.0"
    (backend,) = project["build-system"]["requires"]
    assert backend == "setuptools>=77"  # the first release that reads license expressions
