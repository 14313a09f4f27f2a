"""The mutation-testing configuration (``[tool.mutmut]`` in pyproject.toml) keeps up with the
code: every module under ``reachlimit/`` is mutated, or is excluded here with the reason it
cannot be; every test file the run selects exists. No mutmut run: the configuration is read
as mutmut 3.8 reads it (``only_mutate`` and ``do_not_mutate`` are ``fnmatch`` patterns on the
path under the repository, ``reachlimit/_path.py``).

``EXCLUDED`` is the one list of what is left out, each entry with its reason; the
configuration's ``do_not_mutate`` must be exactly its patterns.
"""

from __future__ import annotations

import shutil
import tomllib
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from tests.support import ROOT

#: What the in-process run does not mutate, and why.
EXCLUDED = {
    "reachlimit/redis/*": "the shared backend: every path of it runs against a redis-server "
    "(its tests are marked redis), which the in-process run does not start",
}


def mutmut_config(root: Path) -> dict[str, Any]:
    with (root / "pyproject.toml").open("rb") as file:
        config: dict[str, Any] = tomllib.load(file)["tool"]["mutmut"]
    return config


def modules(root: Path) -> list[str]:
    """Every Python module of the package, as mutmut names its path."""
    return sorted(
        path.relative_to(root).as_posix() for path in (root / "reachlimit").rglob("*.py")
    )


def mutated(config: dict[str, Any], module: str) -> bool:
    """Whether mutmut mutates ``module`` under ``config`` (its ``should_mutate``)."""
    only = config.get("only_mutate", [])
    if only and not any(fnmatch(module, pattern) for pattern in only):
        return False
    return not any(fnmatch(module, pattern) for pattern in config.get("do_not_mutate", []))


def unaccounted(root: Path) -> list[str]:
    """The modules neither mutated nor excluded in ``EXCLUDED``."""
    config = mutmut_config(root)
    return [
        module for module in modules(root)
        if not mutated(config, module)
        and not any(fnmatch(module, pattern) for pattern in EXCLUDED)
    ]


def test_every_module_is_mutated_or_excluded_with_a_reason() -> None:
    assert unaccounted(ROOT) == []


def test_the_exclusions_are_the_configurations_and_each_still_excludes_a_module() -> None:
    config = mutmut_config(ROOT)
    assert sorted(config.get("do_not_mutate", [])) == sorted(EXCLUDED)
    for pattern in EXCLUDED:
        matched = [module for module in modules(ROOT) if fnmatch(module, pattern)]
        assert matched, f"{pattern} excludes no module any more"
        assert not any(mutated(config, module) for module in matched)


def test_every_named_module_and_test_file_exists() -> None:
    config = mutmut_config(ROOT)
    for pattern in config.get("only_mutate", []):
        assert any(fnmatch(module, pattern) for module in modules(ROOT)), pattern
    selection = config["pytest_add_cli_args_test_selection"]
    assert selection
    missing = [name for name in selection if not (ROOT / name.split("::")[0]).is_file()]
    assert missing == []
    assert len(set(selection)) == len(selection)
    for name in config.get("also_copy", []):
        assert (ROOT / name).exists(), name


def test_the_run_leaves_out_every_test_that_needs_a_server_a_browser_or_a_build() -> None:
    arguments = mutmut_config(ROOT)["pytest_add_cli_args"]
    markers = arguments[arguments.index("-m") + 1]
    for marker in ("gunicorn", "browser", "redis", "wheel"):
        assert f"not {marker}" in markers


def test_a_new_module_fails_the_check_until_it_is_configured(tmp_path: Path) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(ROOT / "reachlimit", tmp_path / "reachlimit")
    assert unaccounted(tmp_path) == []
    (tmp_path / "reachlimit" / "_new.py").write_text('"""A module no one configured."""\n')
    assert unaccounted(tmp_path) == ["reachlimit/_new.py"]
    (tmp_path / "reachlimit" / "redis" / "_new.py").write_text('"""Excluded with its package."""\n')
    assert unaccounted(tmp_path) == ["reachlimit/_new.py"]
