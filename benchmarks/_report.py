"""What every benchmark result says the same way: what was measured, where and when.

The scripts run standalone (``python benchmarks/NAME.py``), so this folder is on ``sys.path``
and they import this module as ``_report``. Importing it also puts the repository root on
``sys.path``, so that a script uses the harness the tests use (``tests/support``: gunicorn,
redis-server, ports, processes, waiting for a state) rather than a copy of its own.

Every result is one JSON object with the same head (:func:`start`): the script's name, the
date, reachlimit's version and the commit it ran at (``dirty`` when the library or the
benchmarks differed from it), and the machine (:func:`machine`: the platform, the CPU, the
versions of what the benchmarks compare, and the load average at the start; :func:`finish` adds
the load average at the end). A script's figures follow, with ``figures``: its headline figures
by name, which ``compare.py`` sets side by side and ``figures.py`` puts in the README's table.
``--json`` prints the result, ``--output PATH`` writes it (both at once are fine), and without
either the script prints its text report.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: The distributions whose versions every result records (field: distribution).
VERSIONS = {
    "flask": "flask",
    "gunicorn": "gunicorn",
    "flask_limiter": "flask-limiter",
    "redis_py": "redis",
    "prometheus_client": "prometheus_client",
    "pyperf": "pyperf",
}


def version_of(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def loadavg() -> list[float]:
    """The 1-, 5- and 15-minute load averages now."""
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    """Where the figures came from; the load average is the one at the start (other processes
    share the cores: it says how noisy the run was)."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "switch_interval_ms": sys.getswitchinterval() * 1000,
        **{field: version_of(dist) for field, dist in VERSIONS.items()},
        "redis_server": None,  # set by a script that starts one
        "loadavg": loadavg(),
    }


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=10, check=False)  # fmt: skip
    except OSError:
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def source() -> dict[str, Any]:
    """The code measured: reachlimit's version, the commit, and whether the library or the
    benchmarks had uncommitted changes (``dirty``); ``commit`` is None outside a checkout."""
    from reachlimit import __version__

    changes = _git("status", "--porcelain", "--untracked-files=no", "--", "reachlimit",
                   "benchmarks/*.py")  # fmt: skip
    return {"reachlimit_version": __version__, "commit": _git("rev-parse", "--short=10", "HEAD"),
            "dirty": bool(changes)}  # fmt: skip


def start(name: str) -> dict[str, Any]:
    """The head of a result, made when the script starts (its load average then)."""
    return {
        "benchmark": name,
        "date": datetime.date.today().isoformat(),
        **source(),
        "machine": machine(),
        "started": time.time(),
    }


def finish(report: dict[str, Any], args: argparse.Namespace,
           render: Callable[[dict[str, Any]], str],
           draw: Callable[[dict[str, Any], Path], None] | None = None) -> int:  # fmt: skip
    """The end of a run: the load average now and the run's length added, the result written
    to ``--output``, drawn to ``--plot`` (by ``draw``), printed as JSON with ``--json`` or else
    as ``render`` writes it. Returns 0 (the exit status)."""
    report["machine"]["loadavg_end"] = loadavg()
    report["elapsed_s"] = round(time.time() - report["started"], 1)
    text = json.dumps(report, indent=2)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n", encoding="utf-8")
    if draw is not None and getattr(args, "plot", None) is not None:
        draw(report, args.plot)
    print(text if args.json else render(report))
    return 0


# -- the command line every script shares ------------------------------------------------------


def parser(description: str, quick: str) -> argparse.ArgumentParser:
    """An argument parser with the options every script takes: ``--json``, ``--output`` and
    ``--quick`` (``quick`` says what the quick run is)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--output", type=Path, metavar="PATH",
                   help="also write the result as JSON to PATH (compare two with compare.py)")
    p.add_argument("--quick", action="store_true", help=quick)
    return p


#: The options several scripts take: name (``--build-ms`` is ``build_ms``) -> (type, what).
OPTIONS: dict[str, tuple[type, str]] = {
    "active": (int, "builds at once (REACHLIMIT_ACTIVE)"),
    "queue": (int, "waiting places (REACHLIMIT_QUEUE)"),
    "wait": (float, "the longest wait, in s (REACHLIMIT_WAIT)"),
    "build_ms": (float, "one cold build, in ms"),
    "servers": (int, "gunicorn servers (of a shared set-up)"),
    "workers": (int, "gthread workers per server (of a shared set-up)"),
    "threads": (int, "threads per worker"),
    "rounds": (int, "rounds of every variant"),
    "duration": (float, "seconds measured per variant"),
    "timeout": (float, "a client request's socket timeout, in s"),
    "clients": (int, "closed-loop clients"),
    "crawlers": (int, "the crawler's connections (closed-loop clients)"),
    "polite": (int, "polite clients"),
    "burst_keys": (int, "distinct cold keys of the burst"),
    "steady_s": (float, "length of the steady streams, in s"),
    "herd": (int, "requests for one cold key in the herd"),
    "idle_s": (float, "the idle warm phase before and after, in s"),
    "warm_ms": (float, "one warm request every this many ms (open loop)"),
    "rate": (str, "the flask-limiter rate (default: the build capacity per second)"),
}


def options(p: argparse.ArgumentParser,
            **defaults: Any) -> Callable[[argparse.Namespace], None]:  # fmt: skip
    """The shared options of :data:`OPTIONS` named, each with its default, or a pair (the
    default, the quick run's); the help says both. Returns ``settle(args)``, which gives
    every one left unset its default, or its quick value under ``--quick``, and makes a
    number that is not above 0 (below 0, for ``--queue``) a usage error."""
    for name, default in defaults.items():
        kind, what = OPTIONS[name]
        full, quick = default if isinstance(default, tuple) else (default, default)
        shown = "" if full is None else f" (default {full}" + (
            f", quick {quick})" if quick != full else ")")
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None, help=what + shown)

    def settle(args: argparse.Namespace) -> None:
        for name, default in defaults.items():
            full, quick = default if isinstance(default, tuple) else (default, default)
            if getattr(args, name) is None:
                setattr(args, name, quick if args.quick else full)
            value, least = getattr(args, name), 0 if name == "queue" else 1e-9
            if isinstance(value, int | float) and value < least:
                p.error(f"--{name.replace('_', '-')} must be {'>= 0' if least == 0 else '> 0'}")

    return settle


def description(doc: str | None) -> str:
    """A script's ``--help`` description: the first paragraph of its docstring."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


# -- figures ----------------------------------------------------------------------------------


def pct(xs: list[float], p: float) -> float | None:
    """Nearest-rank percentile (``p`` in 0-100); None for no samples."""
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def ms(x: float | None) -> float | None:
    return None if x is None else x * 1000


def ratio_of(x: float | None, y: float | None) -> float | None:
    """``x / y``, None when either is missing or ``y`` is 0."""
    return x / y if x is not None and y else None


# -- the text report --------------------------------------------------------------------------


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


#: The names the text reports give the versions a result records.
VERSION_NAMES = {"flask": "Flask", "gunicorn": "gunicorn", "flask_limiter": "Flask-Limiter",
                 "redis_py": "redis-py", "redis_server": "redis-server",
                 "prometheus_client": "prometheus_client", "pyperf": "pyperf"}  # fmt: skip


def head(title: str, report: Mapping[str, Any]) -> list[str]:
    """A text report's head: its title, then where and when it ran, and what."""
    m = report["machine"]
    end = m.get("loadavg_end")
    commit = report["commit"] or "unknown"
    return [
        title,
        f"machine: {m['platform']}",
        f"         {m['cpu']}, {m['cores']} cores, {m['python']}, GIL switch interval "
        f"{m['switch_interval_ms']:g} ms; load average {' '.join(map(str, m['loadavg']))} at "
        f"the start" + (f", {' '.join(map(str, end))} at the end" if end else ""),
        "         " + ", ".join(f"{name} {m[k]}" for k, name in VERSION_NAMES.items() if m.get(k)),
        f"code:    reachlimit {report['reachlimit_version']} at commit {commit}"
        f"{' with uncommitted changes' if report['dirty'] else ''}, {report['date']}",
    ]


def ruled(head: str) -> list[str]:
    """A table's head line and the rule under it."""
    return [head, "-" * len(head)]


def closing(out: list[str], report: Mapping[str, Any]) -> str:
    """The text report: ``out``'s lines, the goals (:func:`goal_lines`) when the report
    states its goals that way, and the run's total time last."""
    goals = report.get("goals")
    if goals and isinstance(goals, list) and "goal" in goals[0]:
        out = [*out, *goal_lines(goals)]
    return "\n".join([*out, f"total time {report['elapsed_s']:.1f} s"])


def goal(name: str, target: str, value: float | None, met: bool) -> dict[str, Any]:
    """One goal as every result states it."""
    return {"goal": name, "target": target, "value": value, "met": bool(met)}


def goal_lines(goals: list[dict[str, Any]]) -> list[str]:
    """``goals:`` and one line a goal: met or MISSED, the value against its target."""
    out = ["goals:"]
    for g in goals:
        v = g["value"]
        value = f"{v:.3f}" if isinstance(v, float) else str(v)
        out.append(f"  [{'met' if g['met'] else 'MISSED':>6}] {g['goal']}: {value} "
                   f"(goal {g['target']})")  # fmt: skip
    return out
