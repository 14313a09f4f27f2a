"""The wheel: built from the checkout's files, installed into a fresh virtual environment,
and used from a folder where the checkout is not on ``sys.path``.

How, and why this way (it needs no internet, only the pip index this machine is configured
with, ``pip config list``):

- build: ``python -m pip wheel --no-deps -w <dist> <copy>``, where ``<copy>`` is a copy of
  the files a build reads (pyproject.toml, setup.cfg, README.md, LICENSE, reachlimit/), so
  that the build's ``build/`` and ``*.egg-info`` never land in the checkout other runs use.
  With build isolation: pip installs the build backend pyproject.toml asks for (setuptools
  >= 77, for the SPDX ``license``) into a throw-away environment from the configured index;
  ``--no-build-isolation`` would use the project venv's older setuptools, which cannot read
  that metadata.
- install: ``python -m venv --without-pip`` (no ``--system-site-packages``: nothing of the
  project venv is visible), then the project venv's pip installs
  ``reachlimit[flask,redis,prometheus]`` from the wheel into it with ``--python``, its
  dependencies resolved from the same index: what a user's ``pip install`` does.
- use: ``python -I`` (no PYTHONPATH, no user site) with the working directory a fresh
  temporary folder imports reachlimit, reachlimit.flask, reachlimit.redis (which reads its
  Lua scripts from the installed package) and reachlimit.gunicorn, checks each came from the
  venv, and runs a tiny Flask app through Flask's test client: a cold() call builds and
  answers the value, a second answers it from the warm cache without a build.

Marked ``wheel`` (``-m "not wheel"`` leaves it out): it takes some seconds (the build and
the install print their durations).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = [pytest.mark.wheel, pytest.mark.timeout(300)]

#: What a build of the wheel reads from the checkout.
BUILD_INPUTS = ("pyproject.toml", "setup.cfg", "README.md", "LICENSE")

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
    "answers": [[r.status_code, r.get_json(), r.headers.get("Cache-Status")]
                for r in (first, second)],
    "builds": builds,
    "py_typed": package.joinpath("py.typed").is_file(),
    "lua_loaded": bool(lua.CACHE_SET.strip()),
}))
'''


def run(command: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done


def copy_build_inputs(to: Path) -> None:
    for name in BUILD_INPUTS:
        shutil.copy2(ROOT / name, to / name)
    shutil.copytree(ROOT / "reachlimit", to / "reachlimit",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def test_the_wheel_installs_into_a_fresh_venv_and_serves_a_flask_app(tmp_path: Path) -> None:
    source, dist, venv, elsewhere = (tmp_path / n for n in ("src", "dist", "venv", "cwd"))
    for folder in (source, dist, elsewhere):
        folder.mkdir()
    copy_build_inputs(source)

    started = time.monotonic()
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist),
         str(source)], tmp_path)
    built = time.monotonic()
    [wheel] = dist.glob("reachlimit-*.whl")

    names = set(zipfile.ZipFile(wheel).namelist())
    lua_files = {f"reachlimit/redis/lua/{p.name}" for p in
                 (ROOT / "reachlimit" / "redis" / "lua").glob("*.lua")}
    assert lua_files and lua_files <= names, sorted(lua_files - names)
    assert {"reachlimit/py.typed", "reachlimit/gunicorn.py", "reachlimit/flask.py"} <= names
    assert not any(n.startswith(("tests/", "webapp/", "benchmarks/")) for n in names)

    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
         f"reachlimit[flask,redis,prometheus] @ {wheel.as_uri()}"], tmp_path)
    installed = time.monotonic()
    print(f"\nwheel built in {built - started:.1f} s, installed with its dependencies into a "
          f"fresh venv in {installed - built:.1f} s")

    used = json.loads(run([str(python), "-I", "-c", USE], elsewhere).stdout)
    assert used["prefix"] == str(venv)
    for path in used["files"]:
        assert Path(path).is_relative_to(venv), path  # the installed copy, not the checkout
    assert not any(Path(p).resolve() == ROOT for p in used["path"] if p)
    assert used["version"] == wheel.name.split("-")[1]
    first, second = used["answers"]
    assert first[:2] == [200, {"key": "k", "build": 1}]
    assert second[:2] == [200, {"key": "k", "build": 1}]  # the same value, not built again
    assert used["builds"] == ["k"]
    assert first[2] is not None and "stored" in first[2]  # Cache-Status of a cold build
    assert second[2] is not None and "hit" in second[2]  # ... and of a warm hit
    assert used["py_typed"] and used["lua_loaded"]
