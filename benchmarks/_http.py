"""The HTTP client side the HTTP benchmarks share (``http_load.py``, ``http_redis.py``,
``fair_admission.py``): ``Sample`` (one GET's kind, start, latency and status), ``fetch`` (one
GET on its own connection, never raising), ``get_json``, the figures over samples
(``status_counts``, ``cold_figures``, ``warm_figures``), and the versions of what is compared
(``version_of``, ``importable``). The server side of ``http_redis.py`` and
``fair_admission.py``: ``BenchGunicorn`` (one gunicorn master serving a benchmark app from
``benchmarks/``, with its ``/stats``), ``all_serving`` (several, each stopped by PID), and
their ends: ``service_machine`` (the machine, the load and the versions, Redis's too),
``redis_missing``, ``unwind_on_sigterm`` and ``finish`` (the report as text or JSON)."""

from __future__ import annotations

import contextlib
import http.client
import importlib
import importlib.metadata
import json
import os
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import _common
from _common import ms, pct

from tests.support import HOST
from tests.support.clients import http_request
from tests.support.gunicorn_server import GunicornServer, serving

HERE = Path(__file__).resolve().parent
READY_DEADLINE_S = 30.0


def version_of(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def importable(module: str) -> bool:
    """Whether ``module`` imports here (the servers run this same interpreter)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def skip_flask_limiter(names: list[str], install: str, as_json: bool) -> dict[str, str]:
    """Take ``flask-limiter`` out of ``names`` when Flask-Limiter does not import here, and
    say why (on stderr too with ``--json``, where the report's text is not printed); the
    result is the report's ``skipped``."""
    skipped: dict[str, str] = {}
    if "flask-limiter" in names and not importable("flask_limiter"):
        names.remove("flask-limiter")
        skipped["flask-limiter"] = (
            "flask-limiter skipped: Flask-Limiter is not installed in this interpreter "
            f"({install})"
        )
        if as_json:
            print(f"note: {skipped['flask-limiter']}", file=sys.stderr)
    return skipped


# -- the HTTP client --------------------------------------------------------------------------


@dataclass
class Sample:
    kind: str  # "cold", "warm" or "idle"
    start: float  # perf_counter at the start
    latency: float  # seconds, connect to last byte of the body
    status: int | None  # None: a transport error
    error: str | None = None


def fetch(port: int, path: str, kind: str, timeout: float) -> Sample:
    """One GET on its own connection (closed afterwards); never raises."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        resp = conn.getresponse()
        resp.read()
        return Sample(kind, start, time.perf_counter() - start, resp.status)
    except (OSError, http.client.HTTPException) as exc:
        return Sample(kind, start, time.perf_counter() - start, None, type(exc).__name__)
    finally:
        conn.close()


def get_json(port: int, method: str, path: str, timeout: float = 5.0) -> Any:
    reply = http_request(port, method, path, timeout=timeout, headers={"Connection": "close"})
    if reply.status != 200:
        raise RuntimeError(f"{method} {path}: HTTP {reply.status}: {reply.body[:200]!r}")
    return reply.json()


# -- the server side --------------------------------------------------------------------------


class BenchGunicorn(GunicornServer):
    """One gunicorn master serving ``app`` (a module of ``benchmarks/``) with gthread workers,
    ready once ``/stats`` answers with its token; ``REACHLIMIT_``/``BENCH_`` settings of this
    process (and any ``extra_stripped``) never reach it, only ``env``."""

    def __init__(
        self, app: str, log_dir: Path, name: str, env: dict[str, str], workers: int,
        threads: int, extra_stripped: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        super().__init__(
            app,
            log_dir,
            name,
            env=env,
            workers=workers,
            threads=threads,
            args=["--pythonpath", str(HERE.parent)],
            access_log=False,
            graceful_timeout=5,
            ready_path="/stats",
            token_env="BENCH_TOKEN",
            ready_timeout=READY_DEADLINE_S,
            stripped_env=("REACHLIMIT_", "BENCH_", *extra_stripped),
            chdir=HERE,
            die_with_parent=True,
        )

    def stats(self) -> dict[str, Any]:
        reply = self.request("GET", "/stats", timeout=5)
        if reply.status != 200:
            raise RuntimeError(f"{self.name} /stats: HTTP {reply.status}: {reply.body[:200]!r}")
        figures: dict[str, Any] = reply.json()
        return figures


S = TypeVar("S", bound=GunicornServer)


@contextlib.contextmanager
def all_serving(servers: Iterable[S]) -> Iterator[list[S]]:
    """Each server started in turn (its log not checked), every one stopped by PID on the way
    out."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(serving(s, check_log=False)) for s in servers]


# -- the ends of main() -------------------------------------------------------------------------


def service_machine(dists: Sequence[tuple[str, str]], redis_port: int | None) -> dict[str, Any]:
    """The machine, its load average now, the versions of ``dists`` (field, distribution) and
    the ``redis_server``'s version (``None`` without one)."""
    where: dict[str, Any] = {
        **_common.machine(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        **{field: version_of(dist) for field, dist in dists},
        "redis_server": None,
    }
    if redis_port is not None:
        import redis

        rc = redis.Redis(host=HOST, port=redis_port, socket_timeout=5)
        try:
            where["redis_server"] = rc.info("server").get("redis_version")
        finally:
            rc.close()
    return where


def redis_missing() -> bool:
    """Whether Debian's ``redis-server`` is missing here (then said on stderr)."""
    from tests.support.redis_server import REDIS_SERVER

    if shutil.which(REDIS_SERVER) is None:
        print(f"{REDIS_SERVER} is not installed (Debian: apt-get install redis-server)",
              file=sys.stderr)  # fmt: skip
        return True
    return False


def shared_redis(stack: contextlib.ExitStack, directory: Path) -> tuple[Any, Any]:
    """A redis-server for a run, on a free loopback port in ``directory``, and a client of it:
    the client is closed and the server stopped by its PID when ``stack`` closes."""
    import redis

    from tests.support.redis_server import RedisServer

    server = RedisServer(directory)
    stack.callback(server.stop)
    server.start()
    client = redis.Redis(host=HOST, port=server.port, socket_timeout=5)
    stack.callback(client.close)
    return server, client


def unwind_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C: every gunicorn and the redis-server are stopped by PID."""
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(128 + signal.SIGTERM))


def finish(report: Mapping[str, Any], as_json: bool, render: Callable[[Any], str]) -> int:
    """Print the report (as JSON, or as ``render`` writes it); the script's exit status."""
    print(json.dumps(report, indent=2) if as_json else render(report))
    return 0


# -- figures ----------------------------------------------------------------------------------


def status_counts(samples: list[Sample]) -> dict[str, int]:
    c = Counter(
        "error" if s.status is None
        else "5xx" if s.status >= 500
        else str(s.status) if s.status in (200, 429)
        else "other"
        for s in samples
    )  # fmt: skip
    return {k: c[k] for k in ("200", "429", "5xx", "other", "error")}


def cold_figures(cold: list[Sample]) -> dict[str, Any]:
    ok = [s.latency for s in cold if s.status == 200]
    refused = [s.latency for s in cold if s.status == 429]
    return {
        "status": status_counts(cold),
        "errors": sorted({s.error for s in cold if s.error}),
        "admitted_p50_ms": ms(pct(ok, 50)),
        "admitted_p99_ms": ms(pct(ok, 99)),
        "refused_p50_ms": ms(pct(refused, 50)),
        "refused_p99_ms": ms(pct(refused, 99)),
    }


def warm_figures(samples: list[Sample], prefix: str) -> dict[str, Any]:
    """Latency of the warm requests answered 200; the others are counted, not timed."""
    ok = [s.latency for s in samples if s.status == 200]
    return {
        f"{prefix}_samples": len(samples),
        f"{prefix}_status": status_counts(samples),
        f"{prefix}_p50_ms": ms(pct(ok, 50)),
        f"{prefix}_p99_ms": ms(pct(ok, 99)),
    }
