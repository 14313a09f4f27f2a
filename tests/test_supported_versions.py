"""The supported versions of the libraries reachlimit builds on: one range for each in
pyproject.toml, whose lower bound ``.ci/lowest.txt`` pins for the second pass of ``.ci/run``,
and the installed release inside that range (so each pass tests what it says it does)."""

from __future__ import annotations

import tomllib
from importlib.metadata import requires, version

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.support import ROOT

#: The libraries whose lowest supported release CI runs the tests with.
LIBRARIES = ("flask", "redis", "prometheus-client", "gunicorn")


def canonical(name: str) -> str:
    return name.lower().replace("_", "-")


def ranges() -> dict[str, set[str]]:
    """Every range pyproject.toml gives each library, over all its extras."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found: dict[str, set[str]] = {}
    for requirements in project["optional-dependencies"].values():
        for text in requirements:
            requirement = Requirement(text)
            found.setdefault(canonical(requirement.name), set()).add(str(requirement.specifier))
    return found


def pins() -> dict[str, str]:
    lines = (ROOT / ".ci" / "lowest.txt").read_text().splitlines()
    pairs = (line.split("==") for line in lines if line.strip() and not line.startswith("#"))
    return {canonical(name): release.strip() for name, release in pairs}


def lower_bound(requirement: Requirement) -> Version:
    [lower] = [s.version for s in requirement.specifier if s.operator == ">="]
    return Version(lower)


@pytest.mark.parametrize("name", LIBRARIES)
def test_one_range_whose_lower_bound_is_the_pinned_lowest_release(name: str) -> None:
    [spec] = ranges()[name]  # the same range in every extra that names the library
    assert lower_bound(Requirement(f"x{spec}")) == Version(pins()[name]), (spec, pins())


def test_the_pinned_werkzeug_is_the_lowest_the_pinned_flask_takes() -> None:
    """Read from the installed Flask's own requirements, where it is the pinned one (the
    pass at the lowest versions)."""
    if Version(version("flask")) != Version(pins()["flask"]):
        pytest.skip("checked in the pass at the lowest versions, with the pinned Flask")
    [werkzeug] = [r for r in map(Requirement, requires("flask") or [])
                  if canonical(r.name) == "werkzeug"]
    assert lower_bound(werkzeug) == Version(pins()["werkzeug"]) == Version(version("werkzeug"))


@pytest.mark.parametrize("name", LIBRARIES)
def test_the_installed_release_is_supported(name: str) -> None:
    [spec] = ranges()[name]
    assert Requirement(f"x{spec}").specifier.contains(version(name)), (name, version(name))
