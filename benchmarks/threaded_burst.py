#!/usr/bin/env python3
"""Five admission policies side by side, in one process, against a simulated cold build.

    python benchmarks/threaded_burst.py           # defaults: 200 ms builds, about 1.5 minutes
    python benchmarks/threaded_burst.py --quick   # tiny configuration, a few seconds
    python benchmarks/threaded_burst.py --json    # the same figures as JSON on stdout

The simulated cold build sleeps ``--build-ms`` (a database scan waits on I/O and releases the
GIL), or with ``--burn`` spins the CPU for that long. It counts the builds in flight and keeps
the maximum. The limit every policy is held to is ``active`` builds at once (default 2), i.e.
a goodput ceiling of ``active / build time`` builds per second.

Each request is one thread (a thread-per-request server such as gunicorn's gthread worker):
it runs a handler that first checks a warm cache (the same ``TTLCache`` class for every
policy), then takes the policy's cold path:

  none       no limiter: every cold request builds at once
  pool(2)    a ThreadPoolExecutor(2) runs the whole handler, warm check included: what
             gunicorn ``--threads 2`` amounts to (warm requests queue behind cold builds)
  timed-sem  BoundedSemaphore(2).acquire(timeout=wait): every waiter parks up to ``wait`` s
  refuse@2   BoundedSemaphore(2).acquire(blocking=False): refused at once when both are busy
  reachlimit ColdPath(ColdLimiter(active, queue, wait)): warm bypass, singleflight, recheck,
             bounded FIFO queue, instant queue_full refusal

Policies 1-4 check the cache once, at entry, and build on a miss (no singleflight, no recheck
after waiting): that is what a handler wrapped in a plain semaphore does.

Scenarios (fresh policy, cache and counters for each): a burst of distinct cold keys at once;
a steady overload at twice the build capacity for a bounded time; a same-key herd; a mixed
warm/cold stream. During every scenario, warm probes (cached keys) run in two prober threads;
the warm latency reported counts only probes that started while a cold build was in flight,
and is compared with the same probers run on the same policy while idle, just before and just
after the load.

Everything is bounded: a fixed number of requests, a fixed wait, joins with timeouts, daemon
threads. Latency is measured in the request thread from the handler call to its return.
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import _common
from _common import fmt, machine, ms, pct

from reachlimit import Busy, ColdLimiter, ColdPath, TTLCache

POLICIES = ("none", "pool(2)", "timed-sem", "refuse@2", "reachlimit")
SCENARIOS = ("burst", "steady", "herd", "mixed")
WARM_KEYS = [f"warm-{i}" for i in range(16)]
# A load thread that has not finished this long after its scenario should have ended is
# reported as stuck instead of being waited for.
JOIN_MARGIN_S = 30.0
MAX_THREADS = 1000


# -- the machine ------------------------------------------------------------------------------





# -- the simulated cold build -----------------------------------------------------------------


class ColdWork:
    """The expensive build. Counts builds in flight (and their maximum) and builds per key."""

    def __init__(self, build_s: float, burn: bool) -> None:
        self.build_s = build_s
        self.burn = burn
        self._lock = threading.Lock()
        self.in_flight = 0  # guarded by _lock; read racily by the probes
        self.max_in_flight = 0  # guarded by _lock
        self.completed = 0  # guarded by _lock
        self.per_key: Counter[str] = Counter()  # guarded by _lock
        self.last_end = 0.0  # guarded by _lock

    def build(self, key: str) -> str:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.per_key[key] += 1
        try:
            if self.burn:
                end = time.perf_counter() + self.build_s
                while time.perf_counter() < end:
                    pass
            else:
                time.sleep(self.build_s)
            return f"report:{key}"
        finally:
            with self._lock:
                self.in_flight -= 1
                self.completed += 1
                self.last_end = time.perf_counter()


# -- the policies -----------------------------------------------------------------------------


@dataclass
class Config:
    active: int
    queue: int
    wait: float
    build_s: float
    burn: bool
    burst_keys: int
    steady_s: float
    herd: int
    idle_s: float
    probe_interval_s: float


def new_cache() -> TTLCache[str]:
    return TTLCache(maxsize=4096, ttl=600.0)


class Policy:
    """A request handler: ``handle(key)`` returns True when answered, False when refused."""

    name = ""

    def __init__(self, work: ColdWork, cfg: Config) -> None:
        self.work = work
        self.cfg = cfg
        self.cache = new_cache()

    def handle(self, key: str) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def extra(self) -> dict[str, Any]:
        return {}

    def _build_and_cache(self, key: str) -> None:
        self.cache.set(key, self.work.build(key))


class NoLimit(Policy):
    name = "none"

    def handle(self, key: str) -> bool:
        if self.cache.get(key) is None:
            self._build_and_cache(key)
        return True


class BoundedPool(Policy):
    name = "pool(2)"

    def __init__(self, work: ColdWork, cfg: Config) -> None:
        super().__init__(work, cfg)
        self.pool = concurrent.futures.ThreadPoolExecutor(cfg.active, thread_name_prefix="pool")

    def handle(self, key: str) -> bool:
        self.pool.submit(self._serve, key).result(timeout=300)
        return True

    def _serve(self, key: str) -> None:  # runs in a pool thread, warm check included
        if self.cache.get(key) is None:
            self._build_and_cache(key)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class _SemaphorePolicy(Policy):
    """A handler wrapped in a plain BoundedSemaphore(active): warm check, then take a slot
    the way ``_take`` says (no queue cap, no singleflight, no recheck after waiting)."""

    def __init__(self, work: ColdWork, cfg: Config) -> None:
        super().__init__(work, cfg)
        self.sem = threading.BoundedSemaphore(cfg.active)

    def _take(self) -> bool:
        raise NotImplementedError

    def handle(self, key: str) -> bool:
        if self.cache.get(key) is not None:
            return True
        if not self._take():
            return False
        try:
            self._build_and_cache(key)
        finally:
            self.sem.release()
        return True


class TimedSemaphore(_SemaphorePolicy):
    name = "timed-sem"

    def _take(self) -> bool:
        return self.sem.acquire(timeout=self.cfg.wait)  # every waiter parks up to `wait`


class InstantRefusal(_SemaphorePolicy):
    name = "refuse@2"

    def _take(self) -> bool:
        return self.sem.acquire(blocking=False)


class Reachlimit(Policy):
    name = "reachlimit"

    def __init__(self, work: ColdWork, cfg: Config) -> None:
        super().__init__(work, cfg)
        self.path = ColdPath(
            ColdLimiter(active=cfg.active, queue=cfg.queue, wait=cfg.wait), cache=self.cache
        )

    def handle(self, key: str) -> bool:
        try:
            self.path.get(key, lambda: self.work.build(key))
        except Busy:
            return False
        return True

    def extra(self) -> dict[str, Any]:
        return {"coldpath_stats": self.path.stats().as_dict()}


FACTORIES: dict[str, Callable[[ColdWork, Config], Policy]] = {
    p.name: p for p in (NoLimit, BoundedPool, TimedSemaphore, InstantRefusal, Reachlimit)
}


# -- load -------------------------------------------------------------------------------------


@dataclass
class Request:
    offset: float  # seconds after the scenario's start
    kind: str  # "cold" or "warm"
    key: str


@dataclass
class Record:
    kind: str
    start: float
    latency: float
    ok: bool
    busy: bool  # a cold build was in flight when the request started (racy read)
    error: str | None = None


def requests_for(scenario: str, cfg: Config) -> list[Request]:
    capacity = cfg.active / cfg.build_s  # builds per second the limit allows
    if scenario == "burst":
        return [Request(0.0, "cold", f"burst-{i}") for i in range(cfg.burst_keys)]
    if scenario == "herd":
        return [Request(0.0, "cold", "herd") for _ in range(cfg.herd)]
    if scenario == "steady":
        rate = 2 * capacity
        n = max(1, round(rate * cfg.steady_s))
        return [Request(i / rate, "cold", f"steady-{i}") for i in range(n)]
    if scenario == "mixed":
        # Cold requests at twice the capacity, interleaved with as many warm requests.
        rate = 2 * capacity
        n = max(1, round(rate * cfg.steady_s))
        out = []
        for i in range(n):
            out.append(Request(i / rate, "cold", f"mixed-{i}"))
            out.append(Request((i + 0.5) / rate, "warm", WARM_KEYS[i % len(WARM_KEYS)]))
        return out
    raise ValueError(scenario)


def probe(
    policy: Policy, stop: threading.Event, out: list[Record], t0: float, interval: float, first: int
) -> None:
    """Warm requests one after another until ``stop``; runs in its own thread."""
    i = first
    while not stop.is_set():
        key = WARM_KEYS[i % len(WARM_KEYS)]
        i += 1
        busy = policy.work.in_flight > 0
        start = time.perf_counter()
        ok = policy.handle(key)
        out.append(Record("warm", start - t0, time.perf_counter() - start, ok, busy))
        stop.wait(interval)


def run_probers(
    policy: Policy, stop: threading.Event, out: list[Record], t0: float, interval: float
) -> list[threading.Thread]:
    threads = [
        threading.Thread(
            target=probe, args=(policy, stop, out, t0, interval, k), name=f"probe-{k}", daemon=True
        )
        for k in range(2)
    ]
    for t in threads:
        t.start()
    return threads


def idle_warm(policy: Policy, cfg: Config) -> list[float]:
    """Warm latencies from the probers with no load at all."""
    out: list[Record] = []
    stop = threading.Event()
    threads = run_probers(policy, stop, out, time.perf_counter(), cfg.probe_interval_s)
    time.sleep(cfg.idle_s)
    stop.set()
    for t in threads:
        t.join(timeout=JOIN_MARGIN_S)
    return [r.latency for r in out]


def client(
    policy: Policy, req: Request, go: threading.Event, t0: list[float], out: list[Record]
) -> None:
    go.wait()
    delay = t0[0] + req.offset - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    busy = policy.work.in_flight > 0
    start = time.perf_counter()
    try:
        ok, error = policy.handle(req.key), None
    except Exception as exc:  # reported in the figures, never silent
        ok, error = False, repr(exc)
    out.append(Record(req.kind, start - t0[0], time.perf_counter() - start, ok, busy, error))


def run_scenario(policy_name: str, scenario: str, cfg: Config) -> dict[str, Any]:
    work = ColdWork(cfg.build_s, cfg.burn)
    policy = FACTORIES[policy_name](work, cfg)
    for k in WARM_KEYS:
        policy.cache.set(k, f"report:{k}")
    reqs = requests_for(scenario, cfg)
    if len(reqs) > MAX_THREADS:
        raise SystemExit(f"{scenario}: {len(reqs)} requests is more than {MAX_THREADS} threads")
    n_cold = sum(r.kind == "cold" for r in reqs)
    # Generous bound: the arrivals, the whole backlog built two at a time, one full wait.
    bound = max(r.offset for r in reqs) + n_cold * cfg.build_s + cfg.wait + JOIN_MARGIN_S
    try:
        idle = idle_warm(policy, cfg)

        # Kept apart from benchmarks/http_load.py:run_scenario's client threads because these call a
        # policy in this process with its records, those a server over HTTP with its port and paths.
        records: list[Record] = []
        probes: list[Record] = []
        go = threading.Event()
        t0 = [0.0]
        threads = [
            threading.Thread(
                target=client, args=(policy, r, go, t0, records), name=f"req-{i}", daemon=True
            )
            for i, r in enumerate(reqs)
        ]
        for t in threads:
            t.start()
        stop = threading.Event()
        t0[0] = time.perf_counter()
        go.set()
        probers = run_probers(policy, stop, probes, t0[0], cfg.probe_interval_s)
        deadline = time.perf_counter() + bound
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.perf_counter()))
        elapsed = time.perf_counter() - t0[0]
        stuck = sum(t.is_alive() for t in threads)
        stop.set()
        for t in probers:
            t.join(timeout=JOIN_MARGIN_S)

        idle += idle_warm(policy, cfg)
    finally:
        policy.close()

    cold = [r for r in records if r.kind == "cold"]
    admitted = [r.latency for r in cold if r.ok]
    refused = [r.latency for r in cold if not r.ok and r.error is None]
    warm_busy = [r.latency for r in records + probes if r.kind == "warm" and r.busy]
    window = (work.last_end - t0[0]) if work.completed else 0.0
    goodput = work.completed / window if window > 0 else 0.0
    limit = cfg.active / cfg.build_s
    idle_p99 = pct(idle, 99)
    warm_p99 = pct(warm_busy, 99)
    result = {
        "scenario": scenario,
        "policy": policy_name,
        "requests": len(cold),
        "admitted": len(admitted),
        "refused": len(refused),
        "errors": sorted({r.error for r in records if r.error}),
        "stuck": stuck,
        "elapsed_s": elapsed,
        "builds": work.completed,
        "max_in_flight": work.max_in_flight,
        "max_builds_per_key": max(work.per_key.values(), default=0),
        "goodput_per_s": goodput,
        "goodput_pct_of_limit": 100 * goodput / limit,
        "admitted_p50_ms": ms(pct(admitted, 50)),
        "admitted_p99_ms": ms(pct(admitted, 99)),
        "refusal_p50_ms": ms(pct(refused, 50)),
        "refusal_p99_ms": ms(pct(refused, 99)),
        "warm_busy_samples": len(warm_busy),
        "warm_busy_p50_ms": ms(pct(warm_busy, 50)),
        "warm_busy_p99_ms": ms(warm_p99),
        "idle_warm_samples": len(idle),
        "idle_warm_p99_ms": ms(idle_p99),
        "warm_p99_vs_idle": (warm_p99 / idle_p99) if warm_p99 and idle_p99 else None,
    }
    if scenario == "herd":
        result["herd_builds"] = work.per_key["herd"]
    result.update(policy.extra())
    return result





# -- goals ------------------------------------------------------------------------------------


def burst_goals(row: dict[str, Any], cfg: Config) -> dict[str, bool]:
    """The in-process burst goals for one policy's burst row."""
    ref = row["refusal_p99_ms"]
    ratio = row["warm_p99_vs_idle"]
    return {
        "in_flight_within_limit": row["max_in_flight"] <= cfg.active,
        "goodput_ge_90pct": row["goodput_pct_of_limit"] >= 90.0,
        # No refusal at all meets "refusal p99 <= 1 ms" vacuously; the other goals judge it.
        "refusal_p99_le_1ms": ref is None or ref <= 1.0,
        "warm_p99_within_2x_idle": ratio is not None and ratio <= 2.0,
        "no_errors": not row["errors"] and not row["stuck"],
    }


def goals(results: list[dict[str, Any]], cfg: Config) -> list[dict[str, Any]]:
    """Per policy: the burst goals, and the herd goal (one build for the key, every request
    answered). The steady-overload goodput is reported alongside, not judged."""
    out = []
    for policy in dict.fromkeys(r["policy"] for r in results):
        rows = {r["scenario"]: r for r in results if r["policy"] == policy}
        g: dict[str, Any] = {"policy": policy}
        judged: list[bool] = []
        if "burst" in rows:
            g["burst"] = burst_goals(rows["burst"], cfg)
            judged += g["burst"].values()
        if "herd" in rows:
            h = rows["herd"]
            g["herd"] = {"one_build": h["herd_builds"] == 1, "none_refused": h["refused"] == 0}
            judged += g["herd"].values()
        if "steady" in rows:
            g["steady_goodput_pct"] = rows["steady"]["goodput_pct_of_limit"]
        g["all"] = bool(judged) and all(judged)
        out.append(g)
    return out


# -- output -----------------------------------------------------------------------------------


def us(x_ms: float | None) -> str:
    """A latency given in ms, printed in microseconds (refusals and warm hits are that fast)."""
    return "-" if x_ms is None else f"{x_ms * 1000:.0f}"


def render(report: dict[str, Any]) -> str:
    # Kept apart from benchmarks/micro.py:render's opening because each report states its own
    # configuration; the shared part (_common.machine_lines) is already written once.
    m, c = report["machine"], report["config"]
    out = [
        "reachlimit threaded burst: five policies, one process",
        *_common.machine_lines(m),
        f"config:  active {c['active']}, queue {c['queue']}, wait {c['wait']:g} s, build "
        f"{c['build_s'] * 1000:g} ms ({'cpu spin' if c['burn'] else 'sleep'}), limit "
        f"{c['active'] / c['build_s']:g} builds/s; burst {c['burst_keys']} keys, steady/mixed "
        f"{c['steady_s']:g} s at 2x capacity, herd {c['herd']}",
        "admitted latency in ms; refusal and warm latency in us; warm = warm requests started "
        "while a cold build was in flight; idle = the same probes with no load",
        "",
    ]
    head = (
        f"{'policy':<11} {'inflt':>5} {'builds':>6} {'max/key':>7} {'goodput/s':>9} "
        f"{'%limit':>6} {'ok':>4} {'admit p50':>9} {'p99 ms':>7} {'refused':>7} "
        f"{'ref p50':>8} {'p99 us':>8} {'warm p50':>8} {'p99 us':>8} {'idle p99':>8} "
        f"{'x idle':>6}"
    )
    titles = {
        **_common.load_titles(c),
        "mixed": f"mixed: cold keys at 2x capacity + as many warm requests, {c['steady_s']:g} s",
    }

    def line(r: dict[str, Any]) -> str:
        return (
            f"{r['policy']:<11} {r['max_in_flight']:>5} {r['builds']:>6} "
            f"{r['max_builds_per_key']:>7} {r['goodput_per_s']:>9.1f} "
            f"{r['goodput_pct_of_limit']:>5.0f}% {r['admitted']:>4} "
            f"{fmt(r['admitted_p50_ms']):>9} {fmt(r['admitted_p99_ms']):>7} "
            f"{r['refused']:>7} {us(r['refusal_p50_ms']):>8} {us(r['refusal_p99_ms']):>8} "
            f"{us(r['warm_busy_p50_ms']):>8} {us(r['warm_busy_p99_ms']):>8} "
            f"{us(r['idle_warm_p99_ms']):>8} {fmt(r['warm_p99_vs_idle']):>6}"
            + (f"  errors {r['errors']}" if r["errors"] else "")
            + (f"  STUCK {r['stuck']}" if r["stuck"] else "")
        )

    out += _common.scenario_tables(
        report["results"], {s: titles[s] for s in SCENARIOS}, head, line
    )
    # Kept apart from tests/test_redis_urls.py:BAD because these are this benchmark's goal
    # labels and that is a table of URLs: alike in shape only.
    marks = (
        ("burst", "in_flight_within_limit", f"in flight <= {c['active']}"),
        ("burst", "goodput_ge_90pct", "goodput >= 90%"),
        ("burst", "refusal_p99_le_1ms", "refusal p99 <= 1 ms"),
        ("burst", "warm_p99_within_2x_idle", "warm p99 <= 2x idle"),
        ("burst", "no_errors", "no errors"),
        ("herd", "one_build", "herd: 1 build"),
        ("herd", "none_refused", "herd: none refused"),
    )
    present = [m for m in marks if any(m[0] in g for g in report["goals"])]
    if present:
        widths = [max(len(label), 3) for _, _, label in present]
        out.append(
            f"goals ({c['burst_keys']}-key burst, {c['herd']}-request herd); "
            "steady goodput shown, not judged"
        )
        out.append(
            f"{'policy':<11} "
            + " ".join(f"{lb:>{w}}" for (_, _, lb), w in zip(present, widths, strict=True))
            + f" {'steady %':>8}  verdict"
        )
        for g in report["goals"]:
            cells = []
            for (part, key, _), w in zip(present, widths, strict=True):
                v = g.get(part, {}).get(key)
                cells.append(f"{'-' if v is None else ('yes' if v else 'NO'):>{w}}")
            sg = g.get("steady_goodput_pct")
            out.append(
                f"{g['policy']:<11} "
                + " ".join(cells)
                + f" {'-' if sg is None else f'{sg:.0f}%':>8}  "
                + ("holds all" if g["all"] else "misses some")
            )
        out.append(_common.holders(report["goals"]))
    return _common.closing(out, report)


# -- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = _common.parser(
        "Compare five admission policies (no limiter, a 2-thread pool, a timed "
        "semaphore, instant refusal, reachlimit) against a simulated cold build, in one run.",
        "tiny configuration (20 ms builds, 0.3 s wait, short scenarios): a few seconds",
    )
    _common.optional(
        p, "--build-ms", float, "duration of one cold build in ms (default 200, quick 20)"
    )
    p.add_argument(
        "--burn",
        action="store_true",
        help="spin the CPU for the build instead of sleeping (holds the GIL)",
    )
    p.add_argument("--active", type=int, default=2, help="builds at once (default 2)")
    p.add_argument("--queue", type=int, default=8, help="reachlimit queue places (default 8)")
    _common.optional(
        p, "--wait", float, "longest wait of timed-sem and reachlimit in s (default 3, quick 0.3)"
    )
    p.add_argument("--burst-keys", type=int, default=40, help="distinct keys in the burst")
    _common.optional(
        p,
        "--steady-s",
        float,
        "length of the steady and mixed scenarios in s (default 3, quick 0.3)",
    )
    _common.optional(p, "--herd", int, "same-key requests in the herd (default 100, quick 30)")
    _common.optional(
        p,
        "--idle-s",
        float,
        "idle warm probing before and after each run in s (default 0.4, quick 0.05)",
    )
    _common.add_selection(p, POLICIES, SCENARIOS)
    a = p.parse_args(argv)
    q = a.quick
    cfg = Config(
        active=a.active,
        queue=a.queue,
        wait=a.wait if a.wait is not None else (0.3 if q else 3.0),
        build_s=(a.build_ms if a.build_ms is not None else (20.0 if q else 200.0)) / 1000,
        burn=a.burn,
        burst_keys=a.burst_keys,
        steady_s=a.steady_s if a.steady_s is not None else (0.3 if q else 3.0),
        herd=a.herd if a.herd is not None else (30 if q else 100),
        idle_s=a.idle_s if a.idle_s is not None else (0.05 if q else 0.4),
        probe_interval_s=0.001,
    )
    policies, scenarios = _common.selection(p, a, POLICIES, SCENARIOS)
    if cfg.active < 1 or cfg.queue < 0 or cfg.wait <= 0 or cfg.build_s <= 0:
        p.error("need --active >= 1, --queue >= 0, --wait > 0, --build-ms > 0")
    if min(cfg.burst_keys, cfg.herd) < 1 or cfg.steady_s <= 0 or cfg.idle_s <= 0:
        p.error("need --burst-keys >= 1, --herd >= 1, --steady-s > 0, --idle-s > 0")

    started = time.perf_counter()
    results = []
    for scenario in scenarios:
        for name in policies:
            results.append(run_scenario(name, scenario, cfg))
    report: dict[str, Any] = {
        "machine": machine(),
        "config": {**cfg.__dict__, "quick": q, "policies": policies, "scenarios": scenarios},
        "results": results,
        "goals": goals(results, cfg),
        "elapsed_s": time.perf_counter() - started,
    }
    print(json.dumps(report, indent=2) if a.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
