"""The measurement core of the paired benchmarks: a subject against its baseline, timed in turn
in one process, as a ratio; the rounds kept in pyperf's format.

design:

    A script defines its pairs in a generator, ``pairs(worker)``: it sets up what they time,
    yields one :class:`Pair` at a time (its checks read after its rounds) and tears down once
    resumed after the last. The script's own process times nothing: it runs ``--processes``
    worker processes one after the other (the same script with ``--worker``), each with its
    own hash seed and memory layout, as pyperf's runner does; a script with several groups
    (metrics in one process and in several) runs each group's workers with its environment.

    Operations per round: the first worker calibrates each pair as pyperf calibrates its
    loops (from 1, doubled until both sides of a round take ``--min-time``); the other
    workers reuse its counts; ``--number`` fixes them.

    In a worker, each pair runs one warm-up round, then its rounds: the baseline first in
    even rounds, the subject first in odd ones. A round's ratio is subject / baseline within
    that round, so both sides of it saw the same load of a shared machine; the ratio judged
    is the median of the rounds' ratios. This alternating pairing is ours: pyperf's runner
    times one function per benchmark, each in processes of its own, where a change in the
    machine's load between two benchmarks would read as a difference between them.

    Each worker's rounds become pyperf Runs (pyperf collects their metadata: CPU, load,
    date...), merged into one pyperf BenchmarkSuite for the script: for each pair ``KEY``,
    the benchmark ``KEY`` (the rounds' ratios, in pyperf's dimensionless unit ``integer``, one
    loop a value) and ``KEY.<side>`` for each side (seconds per operation). The result file
    is that suite with the script's report beside it, so ``python -m pyperf stats`` and
    ``python -m pyperf compare_to`` read it as it is (``compare.py`` runs the latter).

    The figures of a pair (:func:`figures`), the same in every script: ``ratio`` (median),
    ``ratio_best`` (the best subject round over the best baseline round), ``ratio_spread``
    (lowest and highest round), ``ratio_iqr`` (quartiles), ``<side>_<unit>`` (median time per
    operation, in the script's unit), ``best_<side>_<unit>`` (the best round), ``rounds``,
    ``ops_per_round``, ``processes``, and the pair's checks, added up over the workers
    (:func:`merged`: counts summed, booleans all true, lists joined).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _report

#: The most operations a round may take while calibrating (as pyperf's MAX_LOOPS).
MAX_LOOPS = 2**32
#: The worker's bound; only a broken run gets near it.
WORKER_TIMEOUT_S = 1800


@dataclass
class Side:
    """One side of a pair: what it is, and ``run(n)``: ``n`` operations, the seconds taken."""

    label: str
    run: Callable[[int], float]


@dataclass
class Pair:
    """A subject against its baseline; ``checks()`` is read right after their rounds."""

    key: str
    baseline: Side
    subject: Side
    checks: Callable[[], dict[str, Any]] | None = None


def statement(label: str, stmt: str, names: dict[str, Any]) -> Side:
    """A side that runs ``stmt`` (``timeit``: the statement inlined in the timing loop)."""
    return Side(label, timeit.Timer(stmt, globals=names).timeit)


def call(label: str, fn: Callable[[], object]) -> Side:
    """A side that calls ``fn()``."""
    return Side(label, timeit.Timer(fn).timeit)


def wsgi_caller(
    app: Any, statuses: list[str], headers: list[Any] | None = None
) -> Callable[[dict[str, Any]], bytes]:
    """``request(environ) -> body``: one whole WSGI request to ``app`` (body read and closed),
    its status appended to ``statuses`` (and its headers to ``headers``, when given)."""

    def start_response(status: str, response_headers: Any, exc_info: Any = None) -> None:
        statuses.append(status)
        if headers is not None:
            headers.append(response_headers)

    def request(environ: dict[str, Any]) -> bytes:
        body = app(dict(environ), start_response)
        try:
            return b"".join(body)
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()

    return request


def wsgi_side(label: str, request: Callable[[dict[str, Any]], bytes],
              environ: dict[str, Any]) -> Side:  # fmt: skip
    """A side that sends ``environ`` to the app, one whole request an operation."""
    return statement(label, "request(environ)", {"request": request, "environ": environ})



@dataclass(frozen=True)
class Spec:
    """What a script's pairs are called in its result: the names of the baseline and the
    subject (``baseline``/``limiter``, ``off``/``on``...), the unit of their times (``ns``
    or ``us``), and its default rounds (in all processes together) in a full and a quick run."""

    name: str
    sides: tuple[str, str] = ("baseline", "limiter")
    unit: str = "ns"
    rounds: int = 41
    quick_rounds: int = 5

    @property
    def scale(self) -> float:
        return {"ns": 1e9, "us": 1e6}[self.unit]


@dataclass
class Worker:
    """What ``pairs(worker)`` is given in a worker process: the script's arguments, whether
    this is the first worker (``extra`` figures, measured once, are kept from it only)."""

    args: argparse.Namespace
    index: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def first(self) -> bool:
        return self.index == 0


PairsOf = Callable[[Worker], Iterator[Pair]]


# -- the command line -------------------------------------------------------------------------


def parser(doc: str | None, spec: Spec) -> argparse.ArgumentParser:
    """The options of every paired script (and ``--json``, ``--output``, ``--quick``)."""
    p = _report.parser(_report.description(doc),
                       f"rough figures in seconds: {spec.quick_rounds} rounds in one process, "
                       "short rounds")  # fmt: skip
    p.add_argument("--rounds", type=int, default=None,
                   help=f"rounds of each pair, all processes together (default {spec.rounds})")
    p.add_argument("--processes", type=int, default=None,
                   help="worker processes, run one after the other (default 3, quick 1)")
    p.add_argument("--number", type=int, default=None,
                   help="operations per round and side (default: calibrated)")
    p.add_argument("--min-time", type=float, default=None,
                   help="calibration: the shortest side of a round, in seconds "
                   "(default 0.02, quick 0.002)")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-rounds", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-output", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--loops", default=None, help=argparse.SUPPRESS)
    p.add_argument("--group", default="", help=argparse.SUPPRESS)
    return p


def settle(p: argparse.ArgumentParser, args: argparse.Namespace, spec: Spec) -> None:
    """The defaults of the shared options, and their checks."""
    q = args.quick
    args.rounds = args.rounds or (spec.quick_rounds if q else spec.rounds)
    args.processes = min(args.processes or (1 if q else 3), args.rounds)
    args.min_time = args.min_time or (0.002 if q else 0.02)
    if args.rounds < 1 or args.processes < 1 or (args.number is not None and args.number < 1):
        p.error("--rounds, --processes and --number must be >= 1")
    if args.min_time <= 0:
        p.error("--min-time must be > 0")


# -- in a worker ------------------------------------------------------------------------------


def calibrate(pair: Pair, min_time: float) -> int:
    """Operations per round: doubled from 1 until both sides of a round take ``min_time``."""
    loops = 1
    while min(pair.baseline.run(loops), pair.subject.run(loops)) < min_time:
        if loops * 2 > MAX_LOOPS:
            raise RuntimeError(f"{pair.key}: a round still under {min_time} s at {loops} ops")
        loops *= 2
    return loops


def alternate(pair: Pair, loops: int, rounds: int) -> tuple[list[float], list[float]]:
    """One warm-up round, then ``rounds`` rounds, the baseline first in even ones: the seconds
    per operation of each side in each round."""
    pair.baseline.run(loops)
    pair.subject.run(loops)
    base: list[float] = []
    subject: list[float] = []
    for r in range(rounds):
        sides = [(pair.baseline, base), (pair.subject, subject)]
        for side, out in sides[::-1] if r % 2 else sides:
            out.append(side.run(loops) / loops)
    return base, subject


def _runs(name: str, spec: Spec, base: list[float], subject: list[float], loops: int,
          label: str, meta: Mapping[str, Any]) -> list[Any]:  # fmt: skip
    """The pyperf Runs of one pair in one worker: its ratios, then each side's times."""
    import pyperf

    ratios = [s / b for b, s in zip(base, subject, strict=True)]
    common = {**meta, "description": label}
    return [
        pyperf.Run(ratios, metadata={**common, "name": name, "unit": "integer", "loops": 1}),
        *(pyperf.Run(values, metadata={**common, "name": f"{name}.{side}", "unit": "second",
                                       "loops": loops})  # fmt: skip
          for side, values in zip(spec.sides, (base, subject), strict=True)),
    ]


def work(args: argparse.Namespace, spec: Spec, pairs: PairsOf) -> int:
    """A worker process: every pair timed, the pyperf suite and the checks written to
    ``--worker-output`` (and beside it)."""
    import pyperf

    worker = Worker(args, args.worker)
    loops_given: dict[str, int] = json.loads(args.loops) if args.loops else {}
    meta = {k: v for k, v in _report.source().items() if isinstance(v, str)}
    benchmarks: list[Any] = []
    checks: dict[str, Any] = {}
    loops_used: dict[str, int] = {}
    for pair in pairs(worker):
        loops = args.number or loops_given.get(pair.key) or calibrate(pair, args.min_time)
        base, subject = alternate(pair, loops, args.worker_rounds)
        label = f"{pair.subject.label} vs {pair.baseline.label}"
        name = f"{args.group}/{pair.key}" if args.group else pair.key
        benchmarks += [pyperf.Benchmark([run])
                       for run in _runs(name, spec, base, subject, loops, label, meta)]
        loops_used[pair.key] = loops
        checks[pair.key] = pair.checks() if pair.checks is not None else {}
    pyperf.BenchmarkSuite(benchmarks).dump(str(args.worker_output), replace=True)
    args.worker_output.with_suffix(".extra.json").write_text(json.dumps(
        {"checks": checks, "loops": loops_used, "extra": worker.extra}))
    return 0


# -- in the script's process ------------------------------------------------------------------


def merged(a: Any, b: Any) -> Any:
    """Two workers' checks as one: counts summed, booleans all true, lists joined (each item
    once), mappings key by key; anything else must be the same in both."""
    if isinstance(a, bool) and isinstance(b, bool):
        return a and b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a + b
    if isinstance(a, list) and isinstance(b, list):
        return a + [x for x in b if x not in a]
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: merged(a[k], b[k]) if k in a and k in b else a.get(k, b.get(k))
                for k in {**a, **b}}  # fmt: skip
    return a if a == b else [a, b]


def shares(total: int, parts: int) -> list[int]:
    """``total`` rounds over ``parts`` workers, as evenly as can be."""
    return [total // parts + (i < total % parts) for i in range(parts)]


@dataclass
class Group:
    """The merged runs of one group of workers: its name (the prefix of its benchmarks'
    names, ``<name>/``, unless empty), the pyperf suite, each pair's checks and operations
    per round, and the first worker's ``extra``."""

    name: str
    suite: Any
    checks: dict[str, Any]
    loops: dict[str, int]
    extra: dict[str, Any]
    processes: int

    def benchmark(self, key: str) -> str:
        return f"{self.name}/{key}" if self.name else key


def run_group(script: str, argv: list[str], args: argparse.Namespace, name: str = "",
              env: Callable[[], dict[str, str]] | None = None) -> Group:  # fmt: skip
    """``args.processes`` workers of ``script`` one after the other, with ``argv`` (the
    script's own arguments), the group's ``name`` and ``env()`` added to each one's
    environment."""
    import pyperf

    suite: Any = None
    checks: dict[str, Any] = {}
    loops: dict[str, int] = {}
    extra: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="reachlimit-paired-") as tmp:
        for i, rounds in enumerate(shares(args.rounds, args.processes)):
            out = Path(tmp) / f"worker-{i}.json"
            command = [sys.executable, script, *argv, "--worker", str(i), "--worker-rounds",
                       str(rounds), "--worker-output", str(out), "--group", name]  # fmt: skip
            if loops:
                command += ["--loops", json.dumps(loops)]
            proc = subprocess.run(command, env={**os.environ, **(env() if env else {})},
                                  capture_output=True, text=True, timeout=WORKER_TIMEOUT_S,
                                  check=False)  # fmt: skip
            if proc.returncode != 0:
                raise RuntimeError(f"worker {i} of {script} failed:\n{proc.stderr}")
            got = json.loads(out.with_suffix(".extra.json").read_text())
            part = pyperf.BenchmarkSuite.load(str(out))
            if suite is None:
                suite, loops, extra = part, got["loops"], got["extra"]
            else:
                suite.add_runs(part)
            checks = merged(checks, got["checks"]) if checks else got["checks"]
    return Group(name, suite, checks, loops, extra, args.processes)


def figures(group: Group, spec: Spec, key: str) -> dict[str, Any]:
    """The figures of the pair ``key`` (the module's design)."""
    def values(name: str) -> list[float]:
        return list(group.suite.get_benchmark(group.benchmark(name)).get_values())

    ratios = values(key)
    base, subject = (values(f"{key}.{side}") for side in spec.sides)
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    row: dict[str, Any] = {
        "ratio": statistics.median(ratios),
        "ratio_best": min(subject) / min(base),
        "ratio_spread": [min(ratios), max(ratios)],
        "ratio_iqr": [quartiles[0], quartiles[2]],
    }
    for side, times in zip(spec.sides, (base, subject), strict=True):
        row[f"{side}_{spec.unit}"] = statistics.median(times) * spec.scale
        row[f"best_{side}_{spec.unit}"] = min(times) * spec.scale
    row.update(rounds=len(ratios), ops_per_round=group.loops[key], processes=group.processes)
    row.update(group.checks.get(key, {}))
    return row


def results(group: Group, spec: Spec) -> dict[str, dict[str, Any]]:
    """Every pair's figures, in the order the pairs ran."""
    return {key: figures(group, spec, key) for key in group.loops}


def suite_json(*groups: Group) -> dict[str, Any]:
    """The pyperf suite of one or more groups as one JSON object: the head of a result."""
    import pyperf

    suite = pyperf.BenchmarkSuite([bench for group in groups for bench in group.suite])
    out = io.StringIO()
    suite.dump(out, compact=False)
    data: dict[str, Any] = json.loads(out.getvalue())
    return data


def config(args: argparse.Namespace, group: Group) -> dict[str, Any]:
    """The run's settings, as every paired result states them."""
    return {"rounds": args.rounds, "processes": group.processes, "number": args.number,
            "min_time_s": args.min_time, "quick": args.quick}  # fmt: skip


def parse(p: argparse.ArgumentParser, spec: Spec,
          argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:  # fmt: skip
    """The arguments, settled, and the argv every worker is given (the script's own)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    settle(p, args, spec)
    return args, argv


class Session:
    """One run of a paired script: in a worker process, :meth:`work`; in the script's own
    process, the report begun (the load average at the start), the groups of workers run
    (:meth:`group`), and the result finished (:meth:`finish`)."""

    def __init__(self, script: str, p: argparse.ArgumentParser, spec: Spec, pairs: PairsOf,
                 argv: list[str] | None) -> None:  # fmt: skip
        self.script, self.spec, self.pairs = script, spec, pairs
        self.args, self.argv = parse(p, spec, argv)
        self.in_worker = self.args.worker is not None
        self.report = {} if self.in_worker else _report.start(spec.name)
        self.groups: list[Group] = []

    def work(self) -> int:
        return work(self.args, self.spec, self.pairs)

    def group(self, name: str = "", env: Callable[[], dict[str, str]] | None = None,
              argv: tuple[str, ...] = ()) -> Group:  # fmt: skip
        """A group of workers run: each gets the script's argv and ``argv``."""
        group = run_group(self.script, [*self.argv, *argv], self.args, name, env)
        self.groups.append(group)
        return group

    def finish(self, render: Callable[[dict[str, Any]], str],
               draw: Callable[[dict[str, Any], Path], None] | None = None,
               **parts: Any) -> int:  # fmt: skip
        """The result: the groups' pyperf suite, the run's settings (and ``config``), the
        script's ``parts``; written, drawn, printed (``_report.finish``)."""
        self.report.update(suite_json(*self.groups))
        self.report.update(config={**config(self.args, self.groups[0]),
                                   **parts.pop("config", {})}, **parts)  # fmt: skip
        return _report.finish(self.report, self.args, render, draw)


def ratio_goals(goals: Iterable[tuple[str, str, float]],
                results: Mapping[str, Any]) -> list[dict[str, Any]]:  # fmt: skip
    """A goal for each ``(name, pair, highest ratio)``: the pair's ratio at most that (the
    goal names its pair)."""
    return [{**_report.goal(name, f"<= {most:g}x", results[key]["ratio"],
                            results[key]["ratio"] <= most), "pair": key}
            for name, key, most in goals]  # fmt: skip


def ratio_figures(results: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The headline figures of paired results: each pair's ratio."""
    return {f"{prefix}{key} ratio": row["ratio"] for key, row in results.items()
            if isinstance(row, dict) and "ratio" in row}


# -- the text report ---------------------------------------------------------------------------


def per_op(seconds: float) -> str:
    """A time per operation, in the unit that suits it."""
    for unit, scale in (("ns", 1e9), ("us", 1e6), ("ms", 1e3)):
        if seconds * scale < 10_000:
            return f"{seconds * scale:.0f} {unit}" if unit == "ns" else \
                f"{seconds * scale:.1f} {unit}"
    return f"{seconds:.2f} s"


def table(rows: list[tuple[str, str, dict[str, Any]]], spec: Spec) -> list[str]:
    """One line a pair: ``(subject label, baseline label, figures)``, with the median times,
    the ratio, the best-of-rounds ratio and the rounds' spread."""
    base, subject = (f"{side}_{spec.unit}" for side in spec.sides)
    w1 = max(len(a) for a, _, _ in rows)
    w2 = max(len(b) for _, b, _ in rows)
    out = _report.ruled(f"{spec.sides[1]:<{w1}}  {'per op':>8}  {spec.sides[0]:<{w2}}  "
                        f"{'per op':>8}  {'ratio':>6}  {'best':>6}  {'spread':>11}")
    for a, b, x in rows:
        lo, hi = x["ratio_spread"]
        out.append(f"{a:<{w1}}  {per_op(x[subject] / spec.scale):>8}  {b:<{w2}}  "
                   f"{per_op(x[base] / spec.scale):>8}  {x['ratio']:5.2f}x  "
                   f"{x['ratio_best']:5.2f}x  {lo:4.2f}-{hi:4.2f}x")  # fmt: skip
    return out


def timing_line(row: dict[str, Any]) -> str:
    """How the ratios were timed."""
    return (f"timing:  {row['rounds']} alternating rounds in {row['processes']} process(es); "
            "ratio = median of the rounds' ratios (best-of-rounds and spread beside it)")
