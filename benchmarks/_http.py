"""The HTTP client side the HTTP benchmarks share (``http_load.py``, ``http_redis.py``,
``fair_admission.py``): ``Sample`` (one GET's kind, start, latency and status), ``fetch`` (one
GET on its own connection, never raising), ``get_json``, the figures over samples
(``status_counts``, ``cold_figures``, ``warm_figures``), and the versions of what is compared
(``version_of``, ``importable``)."""

from __future__ import annotations

import http.client
import importlib
import importlib.metadata
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from _common import ms, pct

from tests.support import HOST
from tests.support.clients import http_request


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
