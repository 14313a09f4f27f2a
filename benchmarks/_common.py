"""What every benchmark script reports the same way: the machine, and percentiles.

The scripts run standalone (``python benchmarks/NAME.py``), so this folder is on ``sys.path``
and they import this module as ``_common``. Importing it also puts the repository root on
``sys.path``, so that a script can use the harness the tests use (``tests/support``: the
gunicorn server, ports, processes, waiting for a state) rather than a copy of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _report import closing, fmt, ms, pct, ruled  # noqa: F401 (these scripts' names for them)

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass
class Budgeted:
    """The part of an HTTP benchmark's configuration every one has: the budget's ``active``
    builds at once and one build's length ``build_s``."""

    active: int
    build_s: float

    @property
    def capacity(self) -> float:
        """Builds per second the budget allows: ``active`` builds of ``build_s`` each."""
        return self.active / self.build_s


def machine() -> dict[str, Any]:
    """Where the figures came from (``_report.machine``), the load at the start also under the
    name these scripts print."""
    import _report

    where = _report.machine()
    return {**where, "loadavg_1m": where["loadavg"][0]}


def alternating(
    base: Callable[[int], float], cand: Callable[[int], float], number: int, rounds: int
) -> tuple[list[float], list[float]]:
    """Time two workloads in alternating rounds, after one warm-up run of each.

    ``base(n)`` and ``cand(n)`` run ``n`` operations and return the seconds they took. The
    baseline goes first on even rounds, the candidate on odd ones, so both sides of a round
    see the same machine load. Returns the seconds per operation of every round: base, cand.
    """
    base(max(1, number // 10))  # warm up both (specialising interpreter, caches)
    cand(max(1, number // 10))
    base_s: list[float] = []
    cand_s: list[float] = []
    for r in range(rounds):
        pair = [(base, base_s), (cand, cand_s)]
        if r % 2:
            pair.reverse()
        for run, out in pair:
            out.append(run(number) / number)
    return base_s, cand_s


def ratios(base_s: list[float], cand_s: list[float]) -> dict[str, Any]:
    """Candidate over baseline: the median of the per-round ratios (the figure a goal is
    judged on), best-of-rounds, and the spread."""
    per_round = [c / b for b, c in zip(base_s, cand_s, strict=True)]
    return {
        "ratio": statistics.median(per_round),
        "ratio_best": min(cand_s) / min(base_s),
        "ratio_spread": [min(per_round), max(per_round)],
    }






# -- tables ----------------------------------------------------------------------------------




def load_titles(config: dict[str, Any]) -> dict[str, str]:
    """The titles of the cold scenarios both load benchmarks run, from their configuration."""
    return {
        "burst": f"burst: {config['burst_keys']} distinct cold keys at once",
        "steady": f"steady: distinct cold keys at 2x capacity for {config['steady_s']:g} s",
        "herd": f"herd: {config['herd']} requests for one cold key at once",
    }


def scenario_tables(
    results: list[dict[str, Any]],
    titles: dict[str, str],
    head: str,
    line: Callable[[dict[str, Any]], str],
) -> list[str]:
    """One table a scenario that has results, in the order of ``titles``: its title, ``head``,
    a rule, ``line(row)`` for each of its rows, and a blank line."""
    out: list[str] = []
    for scenario, title in titles.items():
        rows = [r for r in results if r["scenario"] == scenario]
        if rows:
            out += [title, *ruled(head), *(line(r) for r in rows), ""]
    return out


def holders(goals: list[dict[str, Any]]) -> str:
    """The closing line of a goals table."""
    names = [g["policy"] for g in goals if g["all"]]
    return f"policies holding every goal: {', '.join(names) or 'none'}"


def skipped_notes(report: dict[str, Any]) -> list[str]:
    """A ``note:`` line, and a blank one, for each variant the run skipped (and why)."""
    out: list[str] = []
    for note in report["skipped"].values():
        out += [f"note: {note}", ""]
    return out


def machine_lines(m: dict[str, Any]) -> list[str]:
    """The two lines of a report's head that say which machine it ran on."""
    return [
        f"machine: {m['platform']}",
        f"         {m['cpu']}, {m['cores']} cores, {m['python']}, "
        f"GIL switch interval {m['switch_interval_ms']:g} ms, load average {m['loadavg_1m']}",
    ]






# -- the command line every script shares ----------------------------------------------------


def parser(description: str, quick: str) -> argparse.ArgumentParser:
    """An argument parser with the two options every script takes: ``--json`` and
    ``--quick`` (``quick`` says what the quick run is)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--quick", action="store_true", help=quick)
    return p


def optional(p: argparse.ArgumentParser, flag: str, kind: type, text: str) -> None:
    """An option whose default is ``None``: the script picks the full or the quick value."""
    p.add_argument(flag, type=kind, default=None, help=text)


def redis_parser(description: str, quick: str) -> argparse.ArgumentParser:
    """:func:`parser` and ``--url``, for the scripts that start a redis-server of their own
    unless they are given one."""
    p = parser(description, quick)
    p.add_argument("--url", help="an existing Redis (its database is flushed)")
    return p


def add_selection(
    p: argparse.ArgumentParser, policies: Sequence[str], scenarios: Sequence[str]
) -> None:
    """``--policies`` and ``--scenarios``: comma-separated subsets, all of them by default."""
    for option, names in (("--policies", policies), ("--scenarios", scenarios)):
        p.add_argument(
            option, default=",".join(names), help=f"comma-separated subset of {','.join(names)}"
        )


def selection(
    p: argparse.ArgumentParser,
    args: argparse.Namespace,
    policies: Sequence[str],
    scenarios: Sequence[str],
) -> tuple[list[str], list[str]]:
    """The policies and scenarios chosen with :func:`add_selection`; an unknown name is a
    usage error."""
    chosen = [x for x in args.policies.split(",") if x]
    runs = [x for x in args.scenarios.split(",") if x]
    bad = [x for x in chosen if x not in policies] + [x for x in runs if x not in scenarios]
    if bad:
        p.error(f"unknown policy or scenario: {', '.join(bad)}")
    return chosen, runs


@contextlib.contextmanager
def open_loop(
    send: Callable[[int], None], interval_s: float, cap: int, join_s: float, name: str
) -> Iterator[list[int]]:
    """For the length of the ``with`` block, start ``send(i)`` (i = 0, 1, ...) in a thread of
    its own every ``interval_s``, whether or not the earlier ones came back, until the block
    ends or ``cap`` have started. Then every thread is joined, all within ``join_s``, and how
    many were still running is left in the yielded list.

    Open loop on purpose: a prober that waits for its own answer sends one request during a
    2-second stall and a hundred fast ones after it, and the stall vanishes from the p99."""
    stop = threading.Event()
    launched: list[threading.Thread] = []  # appended by the scheduler only; read after its join

    def schedule() -> None:
        t_next = time.perf_counter()
        i = 0
        while not stop.is_set() and i < cap:
            t = threading.Thread(target=send, args=(i,), name=f"{name}-{i}", daemon=True)
            t.start()
            launched.append(t)
            i += 1
            t_next += interval_s
            stop.wait(max(0.0, t_next - time.perf_counter()))

    stuck: list[int] = []
    scheduler = threading.Thread(target=schedule, name=f"{name}-scheduler", daemon=True)
    scheduler.start()
    try:
        yield stuck
    finally:
        stop.set()
        deadline = time.perf_counter() + join_s
        scheduler.join(timeout=join_s)
        for t in launched:
            t.join(timeout=max(0.0, deadline - time.perf_counter()))
        stuck.append(sum(t.is_alive() for t in launched) + scheduler.is_alive())
