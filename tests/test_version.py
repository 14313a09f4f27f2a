"""One version: ``reachlimit.__version__`` is what pyproject.toml reads, what the installed
metadata says, and the changelog's newest release."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib

import reachlimit
from tests.support import ROOT


def test_pyproject_reads_its_version_from_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "reachlimit.__version__"}


def test_the_installed_metadata_has_the_packages_version() -> None:
    # Fails when the environment was installed from another version: reinstall it
    # (pip install -e ., as .ci/run does).
    assert importlib.metadata.version("reachlimit") == reachlimit.__version__


def test_the_changelog_opens_with_unreleased_then_this_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.MULTILINE)
    assert sections[0] == ("Unreleased", "")
    assert sections[1][0] == reachlimit.__version__ and sections[1][1]
    assert all(date for _version, date in sections[1:])
