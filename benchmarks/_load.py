"""The load harness of the load runs: the benchmark app under gunicorn, the clients that load it,
the scenarios they play, and the figures of their answers.

design:

    Servers. :class:`Server` is ``benchmarks/app.py`` under gunicorn (``tests/support``'s
    ``GunicornServer``: a free loopback port, ready once ``/stats`` shows this server's own
    token, stopped by PID, and by Linux should this process die first), its policy and
    settings in its environment; :func:`serving` starts several and stops each by PID.
    :func:`own_redis` is a ``redis-server`` of the run (``tests/support/redis_server.py``).

    Clients. :func:`get` is the one timed request: a GET on its own connection, from a
    loopback address of its own when given (fair admission tells clients apart by it: Linux
    routes all of 127/8 to loopback), that never raises; its :class:`Answer` keeps the wall
    clock at the start (the clock the builds stamp), the latency (``perf_counter``, connect to
    last byte), the status, the headers the app adds and the body.

    Scenarios, as data. A :class:`Request` list (:func:`plan`: ``burst``, ``steady``,
    ``herd``, ``arrival``, ``mixed``; ``overload`` is ``steady`` at another multiple of the
    capacity) is sent by :func:`release`, each request in its own thread at its offset after
    a common start. Streams with no end of their own run for a ``with`` block:
    :func:`open_loop` starts one request every interval in a thread of its own, whether or
    not the earlier ones came back (warm trickles, polite clients, an overload);
    :class:`Clients` are closed loops, each client sending its next request once the last
    came back, after a seeded pause (crawlers, readers of popular keys, clients that back off
    after a refusal). The scripts compose these: ``http_load.py`` and ``threaded_burst.py``
    play plans under a warm trickle, ``http_redis.py`` cold clients under one, ``stale.py``
    readers beside a crawler, ``fair_admission.py`` a crawler beside polite clients,
    ``deadline.py`` an overload, ``redis_recovery.py`` and ``soak.py`` clients through
    faults.

    Every load is bounded: a fixed number of requests or threads, socket timeouts, joins
    with deadlines, daemon threads; a thread still running at its deadline is counted as
    stuck, never waited for.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import re
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import _report
from _report import ms, pct

from tests.support import HOST
from tests.support.clients import http_request
from tests.support.gunicorn_server import GunicornServer, serving

HERE = Path(__file__).resolve().parent
#: Upper bound for a server to start or go idle; only a broken run ever reaches it.
READY_DEADLINE_S = 30.0
#: A thread still running this long after its last request could have timed out is stuck.
JOIN_MARGIN_S = 10.0
#: The keys the app puts in its cache when it is made (``app.py``).
WARM_KEYS = tuple(f"warm-{i}" for i in range(16))
#: The clients' addresses: a crawler, polite clients from POLITE_BASE up, readers.
CRAWLER_ADDR = "127.0.0.2"
POLITE_BASE = 3
READER_ADDR = "127.0.0.20"
#: A worker's lines saying Redis is away and back, in the shipped gunicorn config's log format.
REDIS_DOWN_LINE = re.compile(r"\[pid (\d+)\] reachlimit: reachlimit: Redis at \S+ is unavailable")
REDIS_BACK_LINE = re.compile(r"\[pid (\d+)\] reachlimit: reachlimit: Redis at \S+ answers again")
#: A refusal's reasons, as the app echoes them (``X-Bench-Refusal``).
REASONS = ("queue_full", "displaced", "timeout", "deadline")


def polite_addr(i: int) -> str:
    return f"127.0.0.{POLITE_BASE + i}"


# -- answers ------------------------------------------------------------------------------------


@dataclass
class Answer:
    """One request: who sent it (``kind``), what, when (``start``: the wall clock), how long
    it took and what came back (``status`` None: a transport error, named by ``error``)."""

    kind: str
    path: str
    start: float
    latency: float
    status: int | None
    error: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    source: str = ""

    @property
    def end(self) -> float:
        return self.start + self.latency

    @property
    def reason(self) -> str | None:
        """A refusal's reason, as the app said it."""
        return self.headers.get("x-bench-refusal")

    @property
    def peer(self) -> str | None:
        """The address the app saw the request come from."""
        return self.headers.get("x-bench-peer")

    @property
    def waited(self) -> float:
        """Seconds the request waited in the handler before its build started or it was
        refused, as the app said."""
        return float(self.headers.get("x-bench-waited-ms", "0")) / 1000

    @property
    def cache_status(self) -> str | None:
        return self.headers.get("cache-status")

    @property
    def built(self) -> float | None:
        """When the answer's data was built (the build's wall-clock stamp), for a 200."""
        if self.status != 200:
            return None
        try:
            body = json.loads(self.body)
            return float(body.get("built_at", body.get("built")))
        except (ValueError, TypeError, AttributeError):
            return None

    @property
    def age(self) -> float | None:
        """How old the answer's data was when it arrived."""
        built = self.built
        return None if built is None else self.end - built


def get(port: int, path: str, kind: str, timeout: float, source: str | None = None) -> Answer:
    """One GET on its own connection, from ``source`` when given; never raises."""
    start, began = time.time(), time.perf_counter()
    try:
        reply = http_request(port, "GET", path, timeout=timeout, source=source,
                             headers={"Connection": "close"})  # fmt: skip
    except (OSError, http.client.HTTPException) as exc:
        return Answer(kind, path, start, time.perf_counter() - began, None, type(exc).__name__,
                      source=source or "")  # fmt: skip
    return Answer(kind, path, start, time.perf_counter() - began, reply.status,
                  headers=reply.headers, body=reply.body, source=source or "")  # fmt: skip


def get_json(port: int, method: str, path: str, timeout: float = 5.0) -> Any:
    reply = http_request(port, method, path, timeout=timeout, headers={"Connection": "close"})
    if reply.status != 200:
        raise RuntimeError(f"{method} {path}: HTTP {reply.status}: {reply.body[:200]!r}")
    return reply.json()


# -- figures -------------------------------------------------------------------------------------


def status_counts(answers: Iterable[Answer]) -> dict[str, int]:
    c = Counter(
        "error" if a.status is None
        else "5xx" if a.status >= 500
        else str(a.status) if a.status in (200, 429)
        else "other"
        for a in answers
    )  # fmt: skip
    return {k: c[k] for k in ("200", "429", "5xx", "other", "error")}


def bad(status: Mapping[str, int]) -> int:
    """Answers that are neither a 200 nor a 429: 5xx, another status, a transport error."""
    return status["5xx"] + status["other"] + status["error"]


def latencies(answers: Iterable[Answer], status: int) -> list[float]:
    return [a.latency for a in answers if a.status == status]


def cold_figures(cold: list[Answer]) -> dict[str, Any]:
    """The statuses of the cold requests, their errors and the latency of the admitted and
    the refused."""
    ok, refused = latencies(cold, 200), latencies(cold, 429)
    return {
        "status": status_counts(cold),
        "errors": sorted({a.error for a in cold if a.error}),
        "admitted_p50_ms": ms(pct(ok, 50)),
        "admitted_p99_ms": ms(pct(ok, 99)),
        "refused_p50_ms": ms(pct(refused, 50)),
        "refused_p99_ms": ms(pct(refused, 99)),
    }


def warm_figures(answers: list[Answer], prefix: str) -> dict[str, Any]:
    """Latency of the warm requests answered 200; the others are counted, not timed."""
    ok = latencies(answers, 200)
    return {
        f"{prefix}_samples": len(answers),
        f"{prefix}_status": status_counts(answers),
        f"{prefix}_p50_ms": ms(pct(ok, 50)),
        f"{prefix}_p99_ms": ms(pct(ok, 99)),
    }


def reasons_of(answers: Iterable[Answer]) -> dict[str, int]:
    """The refusals by the reason the app gave."""
    c = Counter(a.reason or "unknown" for a in answers if a.status == 429)
    return {k: c[k] for k in (*REASONS, "unknown")}


def limiter_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, int]:
    """The limiter's counts over a measured phase; its peaks as they were at its end."""
    keys = ("acquired", "rejected_full", "rejected_timeout", "displaced", "deadline",
            "cancelled", "coalesced")  # fmt: skip
    delta = {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in keys}
    delta.update(peak_active=after["peak_active"], peak_queued=after["peak_queued"])
    return delta


# -- scenarios ----------------------------------------------------------------------------------


@dataclass
class Budget:
    """The budget a load run holds the service to: ``active`` builds at once, ``queue``
    waiting, ``wait`` seconds at most, builds of ``build_s``; its capacity in builds a second."""

    active: int
    queue: int
    wait: float
    build_s: float

    @property
    def capacity(self) -> float:
        return self.active / self.build_s


@dataclass(frozen=True)
class Request:
    """One request of a plan: ``offset`` seconds after the start, a ``kind`` (cold, warm) and
    a key."""

    offset: float
    kind: str
    key: str


@dataclass(frozen=True)
class Shape:
    """What the plans are made of: the budget's capacity (builds per second), the burst's
    distinct keys, the length of the steady streams, the herd's requests for one key, and
    how many times the capacity the steady streams arrive at."""

    capacity: float
    burst: int
    steady_s: float
    herd: int
    overload: float = 2.0


def plan(name: str, shape: Shape, tag: str) -> list[Request]:
    """The requests of the plan ``name``, its cold keys new (``tag``): ``arrival`` (the
    burst's number of warm requests at once: a control), ``burst`` (distinct cold keys at
    once), ``steady`` (distinct cold keys arriving evenly at ``overload`` x the capacity),
    ``herd`` (requests for one cold key at once), ``mixed`` (``steady`` with as many warm
    requests between its arrivals)."""
    rate = shape.overload * shape.capacity
    steady = max(1, round(rate * shape.steady_s))
    if name == "arrival":
        return [Request(0.0, "warm", WARM_KEYS[i % len(WARM_KEYS)]) for i in range(shape.burst)]
    if name == "burst":
        return [Request(0.0, "cold", f"{tag}-burst-{i}") for i in range(shape.burst)]
    if name == "herd":
        return [Request(0.0, "cold", f"{tag}-herd")] * shape.herd
    if name == "steady":
        return [Request(i / rate, "cold", f"{tag}-steady-{i}") for i in range(steady)]
    if name == "mixed":
        return [r for i in range(steady) for r in (
            Request(i / rate, "cold", f"{tag}-mixed-{i}"),
            Request((i + 0.5) / rate, "warm", WARM_KEYS[i % len(WARM_KEYS)]))]
    raise ValueError(name)


def release(requests: Sequence[Request], send: Callable[[int, Request], Answer],
            join_s: float) -> tuple[list[Answer], int, float]:  # fmt: skip
    """Each request in a thread of its own, released together and sent at its offset after
    the start (``send(i, request)``, ``i`` its place in the plan): (the answers, the threads
    still running ``join_s`` after the last offset, the start on the wall clock)."""
    answers: list[Answer] = []  # appended by the request threads (list.append)
    go = threading.Event()
    t0 = [0.0]

    def one(i: int, req: Request) -> None:
        go.wait()
        time.sleep(max(0.0, t0[0] + req.offset - time.perf_counter()))
        answers.append(send(i, req))

    threads = [threading.Thread(target=one, args=(i, r), name=f"req-{i}", daemon=True)
               for i, r in enumerate(requests)]  # fmt: skip
    for t in threads:
        t.start()
    wall, t0[0] = time.time(), time.perf_counter()
    go.set()
    deadline = t0[0] + max((r.offset for r in requests), default=0.0) + join_s
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.perf_counter()))
    return answers, sum(t.is_alive() for t in threads), wall


@contextlib.contextmanager
def open_loop(send: Callable[[int], None], interval_s: float, cap: int, join_s: float,
              name: str) -> Iterator[list[int]]:  # fmt: skip
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


class Clients:
    """``count`` closed-loop clients, each in its own thread until :meth:`stop`, released
    together once all are started: client ``i`` sends ``send(i, n)`` (its ``n``-th request;
    the answer goes to ``answers``), then pauses for a time drawn by its own seeded generator
    from ``pause`` (seconds): after every answer, or with ``every`` false only after one that
    is not a 200 (a client backing off after a refusal; none at all: back to back)."""

    def __init__(self, count: int, send: Callable[[int, int], Answer], answers: list[Answer],
                 pause: tuple[float, float] = (0.0, 0.0), every: bool = False,
                 seed: str = "", name: str = "client") -> None:  # fmt: skip
        self.answers = answers  # appended by the client threads (list.append)
        self._stop = threading.Event()
        self._go = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i, send, pause, every, f"{seed}-{i}"),
                             name=f"{name}-{i}", daemon=True)  # fmt: skip
            for i in range(count)
        ]
        for t in self._threads:
            t.start()
        self._go.set()

    def _run(self, i: int, send: Callable[[int, int], Answer], pause: tuple[float, float],
             every: bool, seed: str) -> None:  # fmt: skip
        jitter = random.Random(seed)  # its own generator: a client thread shares none
        self._go.wait()
        n = 0
        while not self._stop.is_set():
            answer = send(i, n)
            self.answers.append(answer)
            n += 1
            if pause[1] > 0 and (every or answer.status != 200):
                self._stop.wait(jitter.uniform(*pause))

    def stop(self, timeout_s: float) -> int:
        """Stop every client (joined within ``timeout_s`` in all); how many were stuck."""
        self._stop.set()
        deadline = time.perf_counter() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.perf_counter()))
        return sum(t.is_alive() for t in self._threads)


# -- the servers ----------------------------------------------------------------------------


class Server(GunicornServer):
    """One gunicorn master serving ``benchmarks/app.py`` with gthread workers, ready once
    ``/stats`` answers with its token; ``REACHLIMIT_``/``BENCH_`` settings of this process
    never reach it, only ``env``."""

    def __init__(self, name: str, env: Mapping[str, str], log_dir: Path, workers: int = 1,
                 threads: int = 16) -> None:  # fmt: skip
        super().__init__(
            "app:create_app()", log_dir, name, env=dict(env), workers=workers, threads=threads,
            args=["--pythonpath", str(HERE.parent)], access_log=False, graceful_timeout=5,
            ready_path="/stats", token_env="BENCH_TOKEN", ready_timeout=READY_DEADLINE_S,
            stripped_env=("REACHLIMIT_", "BENCH_", "GUNICORN_CMD_ARGS"), chdir=HERE,
            die_with_parent=True,
        )  # fmt: skip

    def stats(self, key: str | None = None) -> dict[str, Any]:
        figures: dict[str, Any] = get_json(self.port, "GET",
                                           "/stats" if key is None else f"/stats?key={key}")
        return figures

    def reset(self) -> None:
        get_json(self.port, "POST", "/stats/reset")

    def wait_idle(self) -> None:
        """Until no build is in flight (bounded); raises if that never happens."""
        from tests.support.waiting import wait_until

        wait_until("no build in flight", lambda: not self.stats()["builds"]["in_flight"],
                   timeout=READY_DEADLINE_S, interval=0.02)  # fmt: skip

    def tracebacks(self) -> int:
        return self.stderr().count("Traceback")


S = TypeVar("S", bound=GunicornServer)


@contextlib.contextmanager
def serving_all(servers: Iterable[S]) -> Iterator[list[S]]:
    """Each server started in turn (its log not checked), every one stopped by PID on the way
    out."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(serving(s, check_log=False)) for s in servers]


def redis_missing() -> bool:
    """Whether Debian's ``redis-server`` is missing here (then said on stderr)."""
    from tests.support.redis_server import REDIS_SERVER

    if shutil.which(REDIS_SERVER) is None:
        print(f"{REDIS_SERVER} is not installed (Debian: apt-get install redis-server)",
              file=sys.stderr)  # fmt: skip
        return True
    return False


def own_redis(stack: contextlib.ExitStack, directory: Path) -> tuple[Any, Any]:
    """A redis-server for a run (a free loopback port, in ``directory``) and a client of it:
    the client closed and the server stopped by its PID when ``stack`` closes."""
    import redis

    from tests.support.redis_sentinel import running
    from tests.support.redis_server import RedisServer

    directory.mkdir(parents=True, exist_ok=True)
    server = stack.enter_context(running(RedisServer(directory)))
    client = redis.Redis(host=HOST, port=server.port, socket_timeout=5)
    stack.callback(client.close)
    return server, client


@contextlib.contextmanager
def redis_unless(url: str | None) -> Iterator[str]:
    """``url``, or else the URL of a redis-server of the run's own (in a temporary directory,
    stopped by its PID on the way out)."""
    if url is not None:
        yield url
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="reachlimit-redis-") as tmp, \
            contextlib.ExitStack() as stack:
        server, _ = own_redis(stack, Path(tmp))
        yield server.url()


def redis_version(client: Any) -> str:
    return str(client.info("server")["redis_version"])


@dataclass
class Place:
    """Where a load run runs: its temporary directory (the servers' logs), and the
    redis-server and a client of it for its ``shared`` set-ups (None without)."""

    dir: Path
    redis: Any = None
    client: Any = None

    def servers(self, setup: str, name: str, env: Mapping[str, str], servers: int, workers: int,
                threads: int) -> contextlib.AbstractContextManager[list[Server]]:  # fmt: skip
        """The servers of one set-up, fresh: ``single`` is one server with one worker and
        its in-process limiter; ``shared`` is ``servers`` x ``workers`` on the run's Redis,
        emptied first (``REACHLIMIT_REDIS_URL``: one budget; builds counted there too)."""
        count, per, env = 1, 1, dict(env)
        if setup == "shared":
            self.client.flushdb()
            count, per = servers, workers
            env.update(REACHLIMIT_REDIS_URL=self.redis.url(), BENCH_REDIS_URL=self.redis.url())
        return serving_all(Server(f"{name}-{i}", env, self.dir, per, threads)
                           for i in range(count))


@contextlib.contextmanager
def place(report: dict[str, Any], name: str, redis: bool) -> Iterator[Place]:
    """A load run's :class:`Place`, with a redis-server of its own when ``redis`` (its
    version recorded in the report's machine; exit status 2 when redis-server is not
    installed); everything stopped and removed on the way out. SIGTERM unwinds it too."""
    import tempfile

    if redis and redis_missing():
        raise SystemExit(2)
    unwind_on_sigterm()
    with tempfile.TemporaryDirectory(prefix=f"reachlimit-{name}-") as tmp, \
            contextlib.ExitStack() as stack:
        where = Place(Path(tmp))
        if redis:
            where.redis, where.client = own_redis(stack, where.dir / "redis")
            report["machine"]["redis_server"] = redis_version(where.client)
        yield where


def unwind_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C: every gunicorn and redis-server is stopped by PID."""
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(128 + signal.SIGTERM))


def skip_flask_limiter(names: list[str], as_json: bool) -> dict[str, str]:
    """Take ``flask-limiter`` out of ``names`` when Flask-Limiter is not installed here, and
    say why (on stderr too with ``--json``, where the text report is not printed); the
    result is the report's ``skipped``."""
    if "flask-limiter" not in names or _report.version_of("flask-limiter") is not None:
        return {}
    names.remove("flask-limiter")
    note = ("flask-limiter skipped: Flask-Limiter is not installed in this interpreter "
            "(pip install -e '.[bench]')")  # fmt: skip
    if as_json:
        print(f"note: {note}", file=sys.stderr)
    return {"flask-limiter": note}


# -- the command line and the text report -------------------------------------------------------


def selection(p: Any, given: str, names: Sequence[str], what: str) -> list[str]:
    """A comma-separated subset of ``names`` (``--policies``, ``--scenarios``...); an
    unknown or empty one is a usage error."""
    chosen = [x for x in given.split(",") if x]
    unknown = [x for x in chosen if x not in names]
    if unknown or not chosen:
        p.error(f"unknown or no {what}: {', '.join(unknown) or '(none given)'}")
    return chosen


def head(title: str, report: Mapping[str, Any]) -> list[str]:
    """A load run's text head: ``_report.head`` and the budget the run held the service to."""
    return [*_report.head(title, report), budget_line(report["config"])]


def budget_line(c: Mapping[str, Any]) -> str:
    """A text report's line of the budget a run held the service to (from its ``config``)."""
    wait = c.get("wait", c.get("wait_s"))
    builds = ", ".join(f"{b * 1000:g}" for b in c.get("builds", [c["build_s"]]))
    line = (f"budget:  active {c['active']}, queue {c['queue']}, wait {wait:g} s; builds of "
            f"{builds} ms ({'a CPU spin' if c.get('burn') else 'sleep'})")
    return line if "builds" in c else f"{line}: {c['active'] / c['build_s']:g} builds/s"


def yes_no(met: bool | None) -> str:
    return "-" if met is None else "yes" if met else "NO"


def skipped_notes(report: Mapping[str, Any]) -> list[str]:
    """A ``note:`` line, and a blank one, for each variant the run skipped (and why)."""
    return [line for note in report.get("skipped", {}).values() for line in (f"note: {note}", "")]


def scenario_tables(results: list[dict[str, Any]], titles: Mapping[str, str], head: str,
                    line: Callable[[dict[str, Any]], str]) -> list[str]:  # fmt: skip
    """One table a scenario that has results, in the order of ``titles``: its title, ``head``,
    a rule, ``line(row)`` for each of its rows, and a blank line."""
    out: list[str] = []
    for scenario, title in titles.items():
        rows = [r for r in results if r["scenario"] == scenario]
        if rows:
            out += [title, *_report.ruled(head), *(line(r) for r in rows), ""]
    return out


def plan_titles(shape: Mapping[str, Any]) -> dict[str, str]:
    """The titles of the plans, from a run's configuration."""
    return {
        "arrival": f"arrival (control): {shape['burst_keys']} warm requests at once, no cold work",
        "burst": f"burst: {shape['burst_keys']} distinct cold keys at once",
        "steady": f"steady: distinct cold keys at 2x capacity for {shape['steady_s']:g} s",
        "herd": f"herd: {shape['herd']} requests for one cold key at once",
        "mixed": f"mixed: cold keys at 2x capacity + as many warm requests, "
                 f"{shape['steady_s']:g} s",
    }


def goal_table(goals: list[dict[str, Any]], marks: Sequence[tuple[str, str]], name: str,
               extra: Callable[[dict[str, Any]], str] = lambda g: "") -> list[str]:  # fmt: skip
    """One line a policy or variant: each goal of ``marks`` (its key in the goal's ``met``,
    its label) met or not, ``extra(goal)``, and its verdict."""
    width = max(13, *(len(str(g[name])) for g in goals))
    out = [f"{name:<{width}}  " + "  ".join(label for _, label in marks) + "  verdict"]
    for g in goals:
        cells = "  ".join(f"{yes_no(g['met'].get(k)):>{len(label)}}" for k, label in marks)
        verdict = "holds all" if all(v is not False for v in g["met"].values()) else "misses some"
        out.append(f"{g[name]:<{width}}  {cells}{extra(g)}  {verdict}")
    holders = [g[name] for g in goals if all(v is not False for v in g["met"].values())]
    out.append(f"holding every goal: {', '.join(holders) or 'none'}")
    return out
