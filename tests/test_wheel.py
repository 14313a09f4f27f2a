"""The release: an sdist and a wheel built from the checkout's files, checked as an index
would check them, the wheel installed into a fresh virtual environment and used from a folder
where the checkout is not on ``sys.path``: the README's quick start runs there.

How, and why this way (it needs no internet, only the pip index this machine is configured
with, ``pip config list``):

- build: ``python -m build --outdir <dist> <copy>`` (the ``release`` extra), where ``<copy>``
  is a copy of the files a build reads (pyproject.toml, setup.cfg, README.md, LICENSE,
  reachlimit/), so that the build's ``build/`` and ``*.egg-info`` never land in the checkout
  other runs use. It makes the sdist, then the wheel from the sdist, so a file the sdist
  forgot fails the wheel. With build isolation: build installs the backend pyproject.toml asks
  for (setuptools >= 77, for the SPDX ``license``) into a throw-away environment from the
  configured index.
- check: ``twine check --strict`` on both (the metadata and the README as PyPI would render
  it); the sdist holds the Lua scripts, the licence and no tests, and both files carry
  ``reachlimit.__version__``.
- install: ``python -m venv --without-pip`` (no ``--system-site-packages``: nothing of the
  project venv is visible), then the project venv's pip installs
  ``reachlimit[flask,redis,prometheus]`` from the wheel into it with ``--python``, its
  dependencies resolved from the same index: what a user's ``pip install`` does.
- use: ``python -I`` (no PYTHONPATH, no user site) with the working directory a fresh
  temporary folder runs the README's Quick start and answers its routes through Flask's test
  client, then imports reachlimit, reachlimit.flask, reachlimit.redis (which reads its Lua
  scripts from the installed package) and reachlimit.gunicorn, checks each came from the venv
  and runs a tiny ``rl.cold()`` app: a build, then a warm hit without one.

Marked ``wheel`` (``-m "not wheel"`` leaves it out): it takes some seconds (the build and the
install print their durations). Without ``build`` or ``twine`` installed it is skipped, but
fails in CI (``.ci/run`` installs the ``release`` extra).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

import reachlimit
from tests.support import ROOT
from tests.support.readme import quick_start

pytestmark = [pytest.mark.wheel, pytest.mark.timeout(300)]

#: What a build of the sdist reads from the checkout.
BUILD_INPUTS = ("pyproject.toml", "setup.cfg", "README.md", "LICENSE")

#: Appended to the README's Quick start, run by the venv's Python in an empty folder.
QUICK_START_CHECK = r'''
import json as _json

_client = app.test_client()
_answers = [_client.get(path) for path in ("/reports/a", "/reports/a", "/totals/a", "/health")]
print(_json.dumps([[r.status_code, r.get_json(), r.headers.get("Cache-Status")]
                   for r in _answers]))
'''

#: Run by the venv's Python in an empty folder: what it prints is checked below.
USE = r'''
import importlib.metadata, importlib.resources, json, sys

import reachlimit, reachlimit.flask, reachlimit.gunicorn, reachlimit.redis
from flask import Flask
from reachlimit.flask import ReachLimit
from reachlimit.redis import lua

app = Flask("wheel")
rl = ReachLimit(app)
builds = []

@app.get("/value/<key>")
def value(key):
    def build():
        builds.append(key)
        return {"key": key, "build": len(builds)}
    return rl.cold(key, build)

client = app.test_client()
first = client.get("/value/k")
second = client.get("/value/k")
package = importlib.resources.files("reachlimit")
print(json.dumps({
    "files": [m.__file__ for m in (reachlimit, reachlimit.flask, reachlimit.redis,
                                   reachlimit.gunicorn)],
    "prefix": sys.prefix,
    "path": sys.path,
    "version": importlib.metadata.version("reachlimit"),
    "module_version": reachlimit.__version__,
    "answers": [[r.status_code, r.get_json(), r.headers.get("Cache-Status")]
                for r in (first, second)],
    "builds": builds,
    "py_typed": package.joinpath("py.typed").is_file(),
    "lua_loaded": bool(lua.CACHE.strip()),
}))
'''


def require_release_tools() -> None:
    """Skip (fail under CI) without ``build`` and ``twine``, the ``release`` extra."""
    missing = [m for m in ("build", "twine") if importlib.util.find_spec(m) is None]
    if missing:
        message = f"{', '.join(missing)} not installed: pip install -e '.[release]'"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def run(command: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done


def copy_build_inputs(to: Path) -> None:
    for name in BUILD_INPUTS:
        shutil.copy2(ROOT / name, to / name)
    shutil.copytree(ROOT / "reachlimit", to / "reachlimit",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def test_the_release_builds_passes_twine_and_its_wheel_runs_the_quick_start(
    tmp_path: Path,
) -> None:
    require_release_tools()
    source, dist, venv, elsewhere = (tmp_path / n for n in ("src", "dist", "venv", "cwd"))
    for folder in (source, dist, elsewhere):
        folder.mkdir()
    copy_build_inputs(source)

    started = time.monotonic()
    run([sys.executable, "-m", "build", "--outdir", str(dist), str(source)], tmp_path)
    built = time.monotonic()
    version = reachlimit.__version__
    [wheel] = dist.glob("reachlimit-*.whl")
    [sdist] = dist.glob("reachlimit-*.tar.gz")
    assert wheel.name == f"reachlimit-{version}-py3-none-any.whl"
    assert sdist.name == f"reachlimit-{version}.tar.gz"
    run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)], tmp_path)

    lua = sorted(p.name for p in (ROOT / "reachlimit" / "redis" / "lua").glob("*.lua"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert lua and {f"reachlimit/redis/lua/{n}" for n in lua} <= names
    assert {"reachlimit/py.typed", "reachlimit/gunicorn.py", "reachlimit/flask.py"} <= names
    assert not any(n.startswith(("tests/", "webapp/", "benchmarks/", "docs/")) for n in names)
    with tarfile.open(sdist) as tar:
        inside = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "LICENSE", "reachlimit/py.typed"} <= inside
    assert {f"reachlimit/redis/lua/{n}" for n in lua} <= inside
    assert not any(n.startswith(("tests/", "webapp/", "benchmarks/")) for n in inside)

    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
         f"reachlimit[flask,redis,prometheus] @ {wheel.as_uri()}"], tmp_path)
    installed = time.monotonic()
    print(f"\nsdist and wheel built in {built - started:.1f} s, the wheel installed with its "
          f"dependencies into a fresh venv in {installed - built:.1f} s")

    # The README's Quick start, as a user would paste it into app.py next to nothing else.
    (elsewhere / "app.py").write_text(quick_start() + QUICK_START_CHECK, encoding="utf-8")
    reports, again, totals, health = json.loads(
        run([str(python), "-I", "app.py"], elsewhere).stdout
    )
    assert reports == [200, {"key": "a", "rows": 42}, "reachlimit; fwd=uri-miss; stored"]
    assert again[:2] == [200, {"key": "a", "rows": 42}] and again[2].startswith("reachlimit; hit")
    assert totals == [200, {"totals": {"key": "a", "rows": 42}}, "reachlimit; fwd=uri-miss; stored"]
    assert health[0] == 200 and health[1]["default"]["builds"] == 2

    used = json.loads(run([str(python), "-I", "-c", USE], elsewhere).stdout)
    assert used["prefix"] == str(venv)
    for path in used["files"]:
        assert Path(path).is_relative_to(venv), path  # the installed copy, not the checkout
    assert not any(Path(p).resolve() == ROOT for p in used["path"] if p)
    assert used["version"] == used["module_version"] == version
    first, second = used["answers"]
    assert first[:2] == [200, {"key": "k", "build": 1}]
    assert second[:2] == [200, {"key": "k", "build": 1}]  # the same value, not built again
    assert used["builds"] == ["k"]
    assert first[2] is not None and "stored" in first[2]  # Cache-Status of a cold build
    assert second[2] is not None and "hit" in second[2]  # ... and of a warm hit
    assert used["py_typed"] and used["lua_loaded"]
