#!/usr/bin/env python3
"""Five admission policies side by side, in one process, against a simulated cold build.

    python benchmarks/threaded_burst.py           # 200 ms builds, about 1.5 minutes
    python benchmarks/threaded_burst.py --quick   # tiny configuration, a few seconds

The build (``app.Builds``) sleeps ``--build-ms`` (a database scan waits on I/O and releases
the GIL), or with ``--burn`` spins the CPU for that long; it counts the builds in flight and
keeps the maximum. Every policy is held to ``active`` builds at once (default 2): a goodput
ceiling of ``active / build time`` builds per second.

Each request is one thread (a thread-per-request server such as gunicorn's gthread worker)
calling the policy's cold path (``app.policy``, the policies of the benchmark app without
Flask) behind the same warm cache (a ``TTLCache``):

  none       no limiter: every cold request builds at once
  pool2      a ThreadPoolExecutor(2) runs the whole handler, warm check included: what
             gunicorn ``--threads 2`` amounts to (warm requests queue behind cold builds)
  timed-sem  BoundedSemaphore(2).acquire(timeout=wait): every waiter parks up to ``wait`` s
  refuse2    BoundedSemaphore(2).acquire(blocking=False): refused at once when both are busy
  reachlimit ColdPath(ColdLimiter(active, queue, wait)): warm bypass, singleflight, recheck,
             bounded queue, instant queue_full refusal

The scenarios (``_load.plan``, fresh policy, cache and counts for each): a burst of distinct
cold keys at once; a steady overload at twice the build capacity for a bounded time; a
same-key herd; a mixed warm/cold stream. During each, two warm probers (closed loops,
``_load.Clients``) ask for cached keys every millisecond; the warm latency reported counts
the warm requests that started before the scenario's last cold answer, against the same
probers on the same policy with nothing else, just before and just after the load.

Everything is bounded: a fixed number of requests, a fixed wait, joins with timeouts, daemon
threads. Latency is measured in the request thread from the call to its return.
"""

from __future__ import annotations

import concurrent.futures
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import _load
import _report
from _load import Answer, Request, Shape
from _report import fmt, ms, pct
from app import Builds, Refused, policy

from reachlimit import TTLCache

POLICIES = ("none", "pool2", "timed-sem", "refuse2", "reachlimit")
SCENARIOS = ("burst", "steady", "herd", "mixed")
#: A request thread still running this long after its scenario should have ended is stuck.
JOIN_MARGIN_S = 30.0
MAX_THREADS = 1000
MARKS = (
    ("in_flight_within_limit", "in flight <= active"),
    ("goodput_ge_90pct", "goodput >= 90%"),
    ("refusal_p99_le_1ms", "refusal p99 <= 1 ms"),
    ("warm_p99_within_2x_idle", "warm p99 <= 2x idle"),
    ("no_errors", "no errors"),
    ("one_build", "herd: 1 build"),
    ("none_refused", "herd: none refused"),
)


@dataclass
class Config(_load.Budget):
    burn: bool
    burst_keys: int
    steady_s: float
    herd: int
    idle_s: float
    probe_interval_s: float


class Handler:
    """One policy's request handler on a fresh cache and build counter: ``send(i, request)``
    answers 200 or 429 (or records the error)."""

    def __init__(self, name: str, cfg: Config) -> None:
        self.builds = Builds(cfg.build_s, burn=cfg.burn)
        cache: TTLCache[Any] = TTLCache(maxsize=4096, ttl=600.0)
        for k in _load.WARM_KEYS:
            cache.set(k, {"key": k})
        self.cold, self.stats = policy("none" if name == "pool2" else name, cache, cfg.active,
                                       cfg.queue, cfg.wait)  # fmt: skip
        self.pool = concurrent.futures.ThreadPoolExecutor(cfg.active, thread_name_prefix="pool") \
            if name == "pool2" else None

    def serve(self, key: str) -> Any:
        return self.cold(key, lambda: self.builds(key))

    def send(self, _: int, req: Request) -> Answer:
        start, began = time.time(), time.perf_counter()
        status, error = 200, None
        try:
            if self.pool is not None:  # the whole handler in a pool thread, warm check included
                self.pool.submit(self.serve, req.key).result(timeout=300)
            else:
                self.serve(req.key)
        except Refused:
            status = 429
        except Exception as exc:  # reported in the figures, never silent
            status, error = None, repr(exc)  # type: ignore[assignment]
        return Answer(req.kind, req.key, start, time.perf_counter() - began, status, error)

    def probers(self, out: list[Answer], cfg: Config) -> _load.Clients:
        """Two warm probers, each asking for a cached key once its last answer came back and
        ``probe_interval_s`` went by."""
        keys = _load.WARM_KEYS
        return _load.Clients(2, lambda i, n: self.send(0, Request(0.0, "warm", keys[n % 16])),
                             out, (cfg.probe_interval_s, cfg.probe_interval_s), every=True,
                             name="probe")  # fmt: skip

    def idle(self, cfg: Config) -> list[Answer]:
        out: list[Answer] = []
        probers = self.probers(out, cfg)
        time.sleep(cfg.idle_s)  # the phase measured
        probers.stop(JOIN_MARGIN_S)
        return list(out)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def run_scenario(name: str, scenario: str, cfg: Config) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    requests = _load.plan(scenario, Shape(cfg.capacity, cfg.burst_keys, cfg.steady_s, cfg.herd),
                          tag)  # fmt: skip
    if len(requests) > MAX_THREADS:
        raise SystemExit(f"{scenario}: {len(requests)} requests is more than {MAX_THREADS}")
    n_cold = sum(r.kind == "cold" for r in requests)
    # Generous: the arrivals, the whole backlog built two at a time, one full wait.
    join_s = n_cold * cfg.build_s + cfg.wait + JOIN_MARGIN_S
    handler = Handler(name, cfg)
    try:
        idle = handler.idle(cfg)
        probes: list[Answer] = []
        probers = handler.probers(probes, cfg)
        answers, stuck, t0 = _load.release(requests, handler.send, join_s)
        probers.stop(JOIN_MARGIN_S)
        idle += handler.idle(cfg)
    finally:
        handler.close()
    cold = [a for a in answers if a.kind == "cold"]
    last_cold = max((a.end for a in cold), default=t0)
    admitted, refused = _load.latencies(cold, 200), _load.latencies(cold, 429)
    warm_busy = [a.latency for a in answers + probes
                 if a.kind == "warm" and a.status == 200 and a.start < last_cold]  # fmt: skip
    builds = handler.builds
    done = builds.figures()
    window = builds.last_end - t0 if done["finished"] else 0.0
    goodput = done["finished"] / window if window > 0 else 0.0
    idle_latency = _load.latencies(idle, 200)
    result = {
        "scenario": scenario, "policy": name, "requests": len(cold),
        "admitted": len(admitted), "refused": len(refused),
        "errors": sorted({a.error for a in answers if a.error}), "stuck": stuck,
        "elapsed_s": last_cold - t0, "builds": done["finished"],
        "max_in_flight": done["max_in_flight"], "max_builds_per_key": builds.most_for_one_key(),
        "goodput_per_s": goodput, "goodput_pct_of_limit": 100 * goodput / cfg.capacity,
        "admitted_p50_ms": ms(pct(admitted, 50)), "admitted_p99_ms": ms(pct(admitted, 99)),
        "refusal_p50_ms": ms(pct(refused, 50)), "refusal_p99_ms": ms(pct(refused, 99)),
        "warm_busy_samples": len(warm_busy), "warm_busy_p50_ms": ms(pct(warm_busy, 50)),
        "warm_busy_p99_ms": ms(pct(warm_busy, 99)), "idle_warm_samples": len(idle_latency),
        "idle_warm_p99_ms": ms(pct(idle_latency, 99)),
        "warm_p99_vs_idle": _report.ratio_of(pct(warm_busy, 99), pct(idle_latency, 99)),
    }  # fmt: skip
    if scenario == "herd":
        result["herd_builds"] = builds.figures(f"{tag}-herd")["key_builds"]
    if handler.stats is not None:
        result["coldpath_stats"] = handler.stats()
    return result


def goals(results: list[dict[str, Any]], cfg: Config) -> list[dict[str, Any]]:
    """Per policy: the burst goals and the herd goals (one build for the key, every request
    answered); the steady-overload goodput beside them, not judged."""
    out = []
    for name in dict.fromkeys(r["policy"] for r in results):
        rows = {r["scenario"]: r for r in results if r["policy"] == name}
        met: dict[str, bool] = {}
        if "burst" in rows:
            b = rows["burst"]
            ratio = b["warm_p99_vs_idle"]
            met.update({
                "in_flight_within_limit": b["max_in_flight"] <= cfg.active,
                "goodput_ge_90pct": b["goodput_pct_of_limit"] >= 90.0,
                # No refusal at all meets "refusal p99 <= 1 ms" vacuously; the rest judge it.
                "refusal_p99_le_1ms": b["refusal_p99_ms"] is None or b["refusal_p99_ms"] <= 1.0,
                "warm_p99_within_2x_idle": ratio is not None and ratio <= 2.0,
                "no_errors": not b["errors"] and not b["stuck"],
            })  # fmt: skip
        if "herd" in rows:
            h = rows["herd"]
            met.update(one_build=h["herd_builds"] == 1, none_refused=h["refused"] == 0)
        steady = rows.get("steady")
        out.append({"policy": name, "met": met, "all": bool(met) and all(met.values()),
                    "steady_goodput_pct": steady["goodput_pct_of_limit"] if steady else None})
    return out


def us(x_ms: float | None) -> str:
    """A latency given in ms, printed in microseconds (refusals and warm hits are that fast)."""
    return "-" if x_ms is None else f"{x_ms * 1000:.0f}"


def render(report: dict[str, Any]) -> str:
    c = report["config"]
    out = [
        *_load.head("reachlimit threaded burst: five policies, one process", report),
        f"load:    burst {c['burst_keys']} keys, steady/mixed {c['steady_s']:g} s at 2x "
        f"capacity, herd {c['herd']}",
        "admitted latency in ms; refusal and warm latency in us; warm = warm requests started "
        "before the last cold answer; idle = the same probes with no load", "",
    ]  # fmt: skip
    head = (f"{'policy':<11} {'inflt':>5} {'builds':>6} {'max/key':>7} {'goodput/s':>9} "
            f"{'%limit':>6} {'ok':>4} {'admit p50':>9} {'p99 ms':>7} {'refused':>7} "
            f"{'ref p50':>8} {'p99 us':>8} {'warm p50':>8} {'p99 us':>8} {'idle p99':>8} "
            f"{'x idle':>6}")

    def line(r: dict[str, Any]) -> str:
        return (f"{r['policy']:<11} {r['max_in_flight']:>5} {r['builds']:>6} "
                f"{r['max_builds_per_key']:>7} {r['goodput_per_s']:>9.1f} "
                f"{r['goodput_pct_of_limit']:>5.0f}% {r['admitted']:>4} "
                f"{fmt(r['admitted_p50_ms']):>9} {fmt(r['admitted_p99_ms']):>7} "
                f"{r['refused']:>7} {us(r['refusal_p50_ms']):>8} {us(r['refusal_p99_ms']):>8} "
                f"{us(r['warm_busy_p50_ms']):>8} {us(r['warm_busy_p99_ms']):>8} "
                f"{us(r['idle_warm_p99_ms']):>8} {fmt(r['warm_p99_vs_idle']):>6}"
                + (f"  errors {r['errors']}" if r["errors"] else "")
                + (f"  STUCK {r['stuck']}" if r["stuck"] else ""))  # fmt: skip

    titles = _load.plan_titles(c)
    out += _load.scenario_tables(report["results"], {s: titles[s] for s in SCENARIOS}, head, line)
    out.append(f"goals ({c['burst_keys']}-key burst, {c['herd']}-request herd; steady goodput "
               "shown, not judged)")
    out += _load.goal_table(report["goals"], MARKS, "policy", lambda g: (
        f"  steady {fmt(g['steady_goodput_pct'], '.0f')}%"))
    return _report.closing(out, report)


def main(argv: list[str] | None = None) -> int:
    p = _report.parser(_report.description(__doc__),
                       "tiny configuration (20 ms builds, 0.3 s wait, short scenarios): seconds")
    settle = _report.options(p, build_ms=(200.0, 20.0), active=2, queue=8, wait=(3.0, 0.3),
                             burst_keys=40, steady_s=(3.0, 0.3), herd=(100, 30),
                             idle_s=(0.4, 0.05))
    p.add_argument("--burn", action="store_true",
                   help="spin the CPU for the build instead of sleeping (holds the GIL)")
    p.add_argument("--policies", default=",".join(POLICIES), help=f"subset of {','.join(POLICIES)}")
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help=f"subset of {','.join(SCENARIOS)}")
    a = p.parse_args(argv)
    settle(a)
    cfg = Config(
        active=a.active, queue=a.queue, wait=a.wait, build_s=a.build_ms / 1000, burn=a.burn,
        burst_keys=a.burst_keys, steady_s=a.steady_s, herd=a.herd, idle_s=a.idle_s,
        probe_interval_s=0.001,
    )  # fmt: skip
    policies = _load.selection(p, a.policies, POLICIES, "policy")
    scenarios = _load.selection(p, a.scenarios, SCENARIOS, "scenario")
    report = _report.start("threaded_burst")
    results = [run_scenario(name, s, cfg) for s in scenarios for name in policies]
    report.update(
        config={**asdict(cfg), "quick": a.quick, "policies": policies, "scenarios": scenarios},
        results=results, goals=goals(results, cfg),
        figures={
            "policies holding every goal": ", ".join(
                g["policy"] for g in goals(results, cfg) if g["all"]),
            **{f"reachlimit burst: {name}": r[k] for r in results
               if r["policy"] == "reachlimit" and r["scenario"] == "burst"
               for k, name in (("max_in_flight", "most builds at once"),
                               ("goodput_pct_of_limit", "goodput %"),
                               ("warm_p99_vs_idle", "warm p99 x idle"))},
        },
    )  # fmt: skip
    return _report.finish(report, a, render)


if __name__ == "__main__":
    sys.exit(main())
