#!/usr/bin/env python3
"""Six admission policies over real HTTP: gunicorn on 127.0.0.1, a bounded client in-process.

    python benchmarks/http_load.py            # defaults: 200 ms builds, about a minute
    python benchmarks/http_load.py --quick    # tiny configuration, about 20 s
    python benchmarks/http_load.py --json     # the same figures as JSON on stdout

For each policy this script starts ``gunicorn -k gthread -w 1 --threads 16`` (``--threads 2``
for ``pool2``) serving ``benchmarks/http_app.py`` on a free loopback port, as a subprocess;
waits for ``/stats`` with a bounded deadline; drives the scenarios below from threads of this
process (``http.client``, one connection per request, each with a socket timeout); and stops
gunicorn by its PID (SIGTERM, a bounded wait, SIGKILL if it lingers; the worker too, by its
PID, should it outlive its master).

  none           no limiter, a dict cache: every cold miss builds at once
  pool2          the ``none`` app under gunicorn ``--threads 2``: at most 2 of anything at once
  timed-sem      BoundedSemaphore(2).acquire(timeout=3), then 429
  refuse2        BoundedSemaphore(2).acquire(blocking=False): 429 at once when both are busy
  flask-limiter  Flask-Limiter, "10 per second" (the build capacity) on the route, in memory
  reachlimit     ReachLimit with its defaults: active 2, queue 8, wait 3 s

Scenarios, one after another on the same server (fresh cold keys each time, the
builds-in-flight maximum reset in between, a new Flask-Limiter window before each):

  arrival  the control: 40 requests at once for warm keys, no cold work at all; what the
           arrival of 40 requests costs one worker by itself
  burst    40 distinct cold keys at once
  steady   distinct cold keys arriving evenly at twice the build capacity for 3 s: the
           sustained cold saturation the warm goal is judged on
  herd     50 requests for one cold key at once

During every scenario, warm requests (pre-cached keys on the same route) start every 10 ms,
each in its own thread, whether or not the earlier ones have come back (open loop: a closed
loop prober hides a stall, sending one request during it and a hundred fast ones after). A
warm request counts as "under load" when it started before the scenario's last cold response
came back. The same warm load runs against the same server with nothing else for 1 s before
the first scenario and 1 s after the last: the idle warm p99.

Goals, judged per policy over every scenario: at most 2 builds in flight (``/stats``);
refusal (429) p99 <= 100 ms; warm p99 during the steady overload <= 3x the idle warm p99, with
every warm request answered 200; no 5xx, no other error status and no transport error. The
warm ratios of the other scenarios and the herd's builds and refusals are reported, not judged.

Flask-Limiter is optional: when it is not importable the ``flask-limiter`` policy is skipped
with a note (in ``--json``: under ``"skipped"``).
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common
import _http
import plots
from _common import fmt, ms, open_loop, pct
from _http import Sample, cold_figures, fetch, get_json, version_of, warm_figures

from tests.support.gunicorn_server import GunicornServer, serving
from tests.support.waiting import wait_until

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
APP = "http_app:create_app()"

POLICIES = ("none", "pool2", "timed-sem", "refuse2", "flask-limiter", "reachlimit")
SCENARIOS = ("arrival", "burst", "steady", "herd")
WARM_KEYS = [f"warm-{i}" for i in range(16)]  # the keys http_app.py pre-caches
#: gunicorn's handler threads: reachlimit needs active + queue + 4 = 14; 16 is what webapp runs.
THREADS = 16
POOL_THREADS = 2
#: The goals.
GOAL_REFUSAL_P99_MS = 100.0
GOAL_WARM_X_IDLE = 3.0
#: Upper bound for a server to start or go idle; only a broken run ever reaches it.
READY_DEADLINE_S = 30.0
#: A load thread still running this long after its last request could have timed out is
#: reported as stuck instead of being waited for.
JOIN_MARGIN_S = 10.0
MAX_THREADS = 400
#: Flask-Limiter's default strategy is a fixed window of the rate's period (1 s here): each
#: scenario starts in a fresh window, so none inherits the previous one's count.
FIXED_WINDOW_S = 1.05


def machine() -> dict[str, Any]:
    """Where the figures came from, with the versions of the servers compared."""
    return {
        **_common.machine(),
        "gunicorn": version_of("gunicorn"),
        "flask": version_of("flask"),
        "flask_limiter": version_of("flask-limiter"),
    }


# -- configuration ----------------------------------------------------------------------------


@dataclass
class Config(_common.Budgeted):
    wait: float
    rate: str
    burst_keys: int
    steady_s: float
    herd: int
    idle_s: float
    warm_interval_s: float
    warm_cap: int
    client_timeout_s: float
    settle_s: float


# -- the server -------------------------------------------------------------------------------


class Server(GunicornServer):
    """One gunicorn master and its one gthread worker, serving one policy of http_app.py.

    Started, checked and stopped by the harness the tests use (``tests/support``): a free
    loopback port, ready once ``/stats`` answers with this server's token, stopped by PID, and
    stopped by Linux too should this script die first."""

    def __init__(self, policy: str, threads: int, cfg: Config, log_dir: Path) -> None:
        self.app_policy = "none" if policy == "pool2" else policy
        self.cfg = cfg
        super().__init__(
            APP,
            log_dir,
            policy,
            env={
                "BENCH_POLICY": self.app_policy,
                "BENCH_BUILD_MS": repr(cfg.build_s * 1000),
                "BENCH_WAIT": repr(cfg.wait),
                "BENCH_ACTIVE": str(cfg.active),
                "BENCH_RATE": cfg.rate,
            },
            workers=1,
            threads=threads,
            args=["--pythonpath", str(ROOT)],
            access_log=False,
            graceful_timeout=5,
            ready_path="/stats",
            token_env="BENCH_TOKEN",
            ready_timeout=READY_DEADLINE_S,
            stripped_env=("REACHLIMIT_", "BENCH_"),
            chdir=HERE,
            die_with_parent=True,
        )

    def stats(self, key: str | None = None) -> dict[str, Any]:
        path = "/stats" if key is None else f"/stats?key={key}"
        figures: dict[str, Any] = get_json(self.port, "GET", path)
        return figures

    def reset(self) -> None:
        get_json(self.port, "POST", "/stats/reset")

    def wait_idle(self) -> None:
        """Until no build is in flight (bounded); raises if that never happens."""
        wait_until(
            "no build in flight",
            lambda: not self.stats()["in_flight"],
            timeout=READY_DEADLINE_S,
            interval=0.02,
        )


def running(policy: str, cfg: Config, log_dir: Path) -> contextlib.AbstractContextManager[Server]:
    server = Server(policy, POOL_THREADS if policy == "pool2" else THREADS, cfg, log_dir)
    return serving(server, check_log=False)


# -- load -------------------------------------------------------------------------------------


def cold_requests(scenario: str, cfg: Config, tag: str) -> list[tuple[float, str]]:
    """(offset in seconds after the start, path) of every cold request of a scenario."""
    if scenario == "arrival":  # the control: as many requests as the burst, all warm
        return [(0.0, f"/cold/{WARM_KEYS[i % len(WARM_KEYS)]}") for i in range(cfg.burst_keys)]
    if scenario == "burst":
        return [(0.0, f"/cold/{tag}-burst-{i}") for i in range(cfg.burst_keys)]
    if scenario == "herd":
        return [(0.0, f"/cold/{tag}-herd")] * cfg.herd
    if scenario == "steady":
        rate = 2 * cfg.capacity
        n = max(1, round(rate * cfg.steady_s))
        return [(i / rate, f"/cold/{tag}-steady-{i}") for i in range(n)]
    raise ValueError(scenario)


def warm_load(
    port: int, kind: str, out: list[Sample], cfg: Config
) -> contextlib.AbstractContextManager[list[int]]:
    """Open-loop warm requests (one every ``warm_interval_s``, at most ``warm_cap``) for the
    length of the ``with`` block, their samples appended to ``out``; the number of threads
    still running at its end is left in the yielded list."""

    def send(i: int) -> None:
        path = f"/cold/{WARM_KEYS[i % len(WARM_KEYS)]}"
        out.append(fetch(port, path, kind, cfg.client_timeout_s))

    return open_loop(
        send, cfg.warm_interval_s, cfg.warm_cap, cfg.client_timeout_s + JOIN_MARGIN_S, kind
    )


def idle_warm(server: Server, cfg: Config) -> list[Sample]:
    """The same warm load as under the scenarios, on the same server, with nothing else."""
    out: list[Sample] = []
    with warm_load(server.port, "idle", out, cfg):
        time.sleep(cfg.idle_s)
    return list(out)


def client(
    port: int,
    offset: float,
    path: str,
    go: threading.Event,
    t0: list[float],
    out: list[Sample],
    timeout: float,
) -> None:
    go.wait()
    delay = t0[0] + offset - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    out.append(fetch(port, path, "cold", timeout))


def run_scenario(server: Server, scenario: str, cfg: Config) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]  # fresh keys: nothing cached by an earlier scenario
    reqs = cold_requests(scenario, cfg, tag)
    if len(reqs) > MAX_THREADS:
        raise SystemExit(f"{scenario}: {len(reqs)} requests is more than {MAX_THREADS} threads")
    server.wait_idle()
    time.sleep(cfg.settle_s if server.app_policy == "flask-limiter" else 0.1)
    server.reset()
    reach_before = server.stats()["reach"]

    cold: list[Sample] = []
    warm: list[Sample] = []
    go = threading.Event()
    t0 = [0.0]
    threads = [
        threading.Thread(
            target=client,
            args=(server.port, off, path, go, t0, cold, cfg.client_timeout_s),
            name=f"req-{i}",
            daemon=True,
        )
        for i, (off, path) in enumerate(reqs)
    ]
    for t in threads:
        t.start()
    with warm_load(server.port, "warm", warm, cfg) as warm_stuck:
        t0[0] = time.perf_counter()
        go.set()
        deadline = t0[0] + reqs[-1][0] + cfg.client_timeout_s + JOIN_MARGIN_S
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.perf_counter()))
    stuck = sum(t.is_alive() for t in threads) + warm_stuck[0]
    elapsed = time.perf_counter() - t0[0]

    server.wait_idle()
    herd_key = f"{tag}-herd" if scenario == "herd" else None
    after = server.stats(herd_key)
    last_cold = max((s.start + s.latency for s in cold), default=t0[0])
    under_load = [s for s in warm if s.start < last_cold]
    row: dict[str, Any] = {
        "scenario": scenario,
        "policy": None,  # filled in by the caller
        "threads": server.threads,
        "requests": len(reqs),
        "stuck": stuck,
        "elapsed_s": elapsed,
        "max_in_flight": after["max_in_flight"],
        **cold_figures(cold),
        **warm_figures(under_load, "warm"),
    }
    if herd_key is not None:
        row["herd_builds"] = after["key_builds"]
    if reach_before is not None:
        reach = after["reach"]
        row["reach_reasons"] = {
            k: reach[k] - reach_before[k]
            for k in ("rejected_full", "rejected_timeout", "cancelled", "coalesced")
        }
    return row


# -- goals ------------------------------------------------------------------------------------


def judge(
    policy: str, rows: list[dict[str, Any]], idle: dict[str, Any], cfg: Config
) -> dict[str, Any]:
    """The four goals for one policy, from its scenario rows and its idle warm figures.

    The warm goal is judged on the steady overload, the sustained cold saturation; the
    ratios of the arrival control, the burst and the herd are reported beside it."""
    refused_p99 = [r["refused_p99_ms"] for r in rows if r["refused_p99_ms"] is not None]
    idle_p99 = idle["idle_p99_ms"]
    warm_x: dict[str, float | None] = {}
    warm_refused: dict[str, int] = {}
    for r in rows:
        p99 = r["warm_p99_ms"]
        warm_x[r["scenario"]] = p99 / idle_p99 if p99 is not None and idle_p99 else None
        warm_refused[r["scenario"]] = r["warm_samples"] - r["warm_status"]["200"]
    bad = sum(
        r[f]["5xx"] + r[f]["error"] + r[f]["other"] for r in rows for f in ("status", "warm_status")
    ) + sum(idle["idle_status"][k] for k in ("5xx", "error", "other"))
    g: dict[str, Any] = {
        "policy": policy,
        "max_in_flight": max((r["max_in_flight"] for r in rows), default=0),
        "refused_p99_ms": max(refused_p99, default=None),
        "warm_x_idle": warm_x,
        "warm_refused": warm_refused,
        "bad_responses": bad,
        "herd_builds": next((r["herd_builds"] for r in rows if r["scenario"] == "herd"), None),
        "herd_refused": next((r["status"]["429"] for r in rows if r["scenario"] == "herd"), None),
    }
    steady_x = warm_x.get("steady")
    warm_met: bool | None = None  # not judged: --scenarios without steady
    if "steady" in warm_x:
        warm_met = (
            steady_x is not None and steady_x <= GOAL_WARM_X_IDLE and warm_refused["steady"] == 0
        )
    g["met"] = {
        "in_flight_within_limit": g["max_in_flight"] <= cfg.active,
        # No refusal at all meets it vacuously; the other goals judge such a policy.
        "refusal_p99_le_100ms": g["refused_p99_ms"] is None
        or g["refused_p99_ms"] <= GOAL_REFUSAL_P99_MS,
        "warm_p99_within_3x_idle": warm_met,
        "no_5xx_or_errors": bad == 0 and not any(r["stuck"] for r in rows),
    }
    g["all"] = all(v is not False for v in g["met"].values())
    return g


# -- running it all ---------------------------------------------------------------------------


def run_policy(
    policy: str, scenarios: list[str], cfg: Config, log_dir: Path
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    with running(policy, cfg, log_dir) as server:
        before = idle_warm(server, cfg)
        rows = []
        for scenario in scenarios:
            row = run_scenario(server, scenario, cfg)
            row["policy"] = policy
            rows.append(row)
        server.wait_idle()
        after = idle_warm(server, cfg)
    idle = before + after
    return rows, {
        "policy": policy,
        "threads": server.threads,
        **warm_figures(idle, "idle"),
        # Each phase on its own, to show how noisy the machine was while this server ran.
        "idle_before_p99_ms": ms(pct([s.latency for s in before if s.status == 200], 99)),
        "idle_after_p99_ms": ms(pct([s.latency for s in after if s.status == 200], 99)),
    }


# -- output -----------------------------------------------------------------------------------


def yes_no(met: bool | None) -> str:
    return "-" if met is None else "yes" if met else "NO"


def render(report: dict[str, Any]) -> str:
    m, c = report["machine"], report["config"]
    out = [
        f"reachlimit HTTP load: {len(c['policies'])} "
        f"polic{'y' if len(c['policies']) == 1 else 'ies'}, gunicorn gthread on 127.0.0.1",
        *_common.machine_lines(m),
        f"         gunicorn {m['gunicorn']}, Flask {m['flask']}, "
        f"Flask-Limiter {m['flask_limiter'] or 'not installed'}",
        f"config:  -w 1 --threads {THREADS} (pool2: {POOL_THREADS}); active {c['active']}, wait "
        f"{c['wait']:g} s, build {c['build_s'] * 1000:g} ms (sleep), capacity "
        f'{c["active"] / c["build_s"]:g} builds/s; flask-limiter "{c["rate"]}"',
        f"         burst {c['burst_keys']} keys, steady {c['steady_s']:g} s at 2x capacity, "
        f"herd {c['herd']}; a warm request every {c['warm_interval_s'] * 1000:g} ms "
        f"(open loop, at most {c['warm_cap']}), idle "
        f"{c['idle_s']:g} s before and after",
        "latency in ms, client side (connect to last byte); warm = warm requests started while "
        "cold requests were outstanding, answered 200; warm !200 = warm requests refused",
        "",
    ]
    out += _common.skipped_notes(report)
    head = (
        f"{'policy':<13} {'inflt':>5} {'req':>4} {'200':>4} {'429':>4} {'5xx':>4} {'err':>4} "
        f"{'ok p50':>7} {'p99':>7} {'429 p50':>7} {'p99':>7} {'warm p50':>8} {'p99':>7} "
        f"{'!200':>5} {'x idle':>6}"
    )
    idle = {i["policy"]: i for i in report["idle"]}
    titles = {
        "arrival": f"arrival (control): {c['burst_keys']} warm requests at once, no cold work",
        **_common.load_titles(c),
    }

    def line(r: dict[str, Any]) -> str:
        st = r["status"]
        ip99 = idle[r["policy"]]["idle_p99_ms"]
        x = r["warm_p99_ms"] / ip99 if r["warm_p99_ms"] is not None and ip99 else None
        extra = ""
        if "herd_builds" in r:
            extra += f"  herd builds {r['herd_builds']}"
        if "reach_reasons" in r:
            rr = r["reach_reasons"]
            extra += f"  (queue_full {rr['rejected_full']}, timeout {rr['rejected_timeout']})"
        if r["errors"]:
            extra += f"  errors {r['errors']}"
        if r["stuck"]:
            extra += f"  STUCK {r['stuck']}"
        return (
            f"{r['policy']:<13} {r['max_in_flight']:>5} {r['requests']:>4} {st['200']:>4} "
            f"{st['429']:>4} {st['5xx']:>4} {st['error'] + st['other']:>4} "
            f"{fmt(r['admitted_p50_ms']):>7} {fmt(r['admitted_p99_ms']):>7} "
            f"{fmt(r['refused_p50_ms']):>7} {fmt(r['refused_p99_ms']):>7} "
            f"{fmt(r['warm_p50_ms']):>8} {fmt(r['warm_p99_ms']):>7} "
            f"{r['warm_samples'] - r['warm_status']['200']:>5} {fmt(x):>6}" + extra
        )

    out += _common.scenario_tables(
        report["results"], {s: titles[s] for s in SCENARIOS}, head, line
    )
    out.append(
        "idle warm (same server, no load, before and after the scenarios): "
        "samples, !200, p50, p99 ms; p99 before | after"
    )
    for i in report["idle"]:
        refused = i["idle_samples"] - i["idle_status"]["200"]
        out.append(
            f"  {i['policy']:<13} {i['idle_samples']:>5} {refused:>5} {fmt(i['idle_p50_ms']):>7} "
            f"{fmt(i['idle_p99_ms']):>7}   {fmt(i['idle_before_p99_ms']):>5} | "
            f"{fmt(i['idle_after_p99_ms'])}"
        )
    out.append("")
    labels = (
        ("in_flight_within_limit", f"in flight <= {c['active']}"),
        ("refusal_p99_le_100ms", f"429 p99 <= {GOAL_REFUSAL_P99_MS:g} ms"),
        ("warm_p99_within_3x_idle", f"warm p99 <= {GOAL_WARM_X_IDLE:g}x idle"),
        ("no_5xx_or_errors", "no 5xx/errors"),
    )
    out.append(
        "goals over every scenario; warm judged on steady (x idle: warm p99 / idle warm p99, "
        "shown for arrival/burst/steady/herd)"
    )
    out.append(
        f"{'policy':<13} {'inflt':>5} {'429 p99':>7} {'warm x idle a/b/s/h':>23} "
        f"{'herd':>9}  " + "  ".join(lb for _, lb in labels) + "  verdict"
    )
    for g in report["goals"]:
        wx = g["warm_x_idle"]
        ratios = "/".join(fmt(wx.get(k)) for k in SCENARIOS)
        herd = "-" if g["herd_builds"] is None else f"{g['herd_builds']}b {g['herd_refused']}r"
        cells = "  ".join(f"{yes_no(g['met'][k]):>{len(lb)}}" for k, lb in labels)
        out.append(
            f"{g['policy']:<13} {g['max_in_flight']:>5} {fmt(g['refused_p99_ms']):>7} "
            f"{ratios:>23} {herd:>9}  {cells}  " + ("holds all" if g["all"] else "misses some")
        )
    out.append("herd: builds of the one key (b) and requests refused (r); not judged")
    out.append(_common.holders(report["goals"]))
    return _common.closing(out, report)


# -- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    # Kept apart from benchmarks/fair_admission.py:main's parser because each script describes
    # itself and its quick mode; the parser itself is _common.parser.
    p = _common.parser(
        "Compare six admission policies over HTTP (gunicorn gthread on 127.0.0.1, "
        "one server per policy) under an arrival control, a burst, a steady overload and a "
        "same-key herd, in one run.",
        "tiny configuration (20 ms builds, 0.3 s wait, short scenarios): about 20 s",
    )
    p.add_argument(
        "--build-ms", type=float, default=None, help="one cold build in ms (default 200, quick 20)"
    )
    _common.optional(
        p, "--wait", float, "longest wait of timed-sem and reachlimit in s (default 3, quick 0.3)"
    )
    p.add_argument(
        "--rate",
        default=None,
        help='the flask-limiter rate (default: the build capacity, "10 per second" at 200 ms)',
    )
    p.add_argument("--burst-keys", type=int, default=None, help="burst keys (default 40, quick 20)")
    p.add_argument(
        "--steady-s", type=float, default=None, help="steady overload in s (default 3, quick 0.5)"
    )
    p.add_argument("--herd", type=int, default=None, help="herd requests (default 50, quick 20)")
    _common.optional(
        p,
        "--idle-s",
        float,
        "idle warm probing before and after the scenarios in s (default 1, quick 0.2)",
    )
    _common.optional(
        p, "--warm-ms", float, "one warm request every this many ms, open loop (default 10)"
    )
    _common.optional(
        p,
        "--warm-cap",
        int,
        "most warm requests in one scenario or idle phase (default 800, quick 200)",
    )
    _common.optional(
        p, "--timeout", float, "socket timeout of every client request in s (default 30, quick 10)"
    )
    _common.add_selection(p, POLICIES, SCENARIOS)
    plots.add_option(p)
    a = p.parse_args(argv)
    q = a.quick
    build_s = (a.build_ms if a.build_ms is not None else (20.0 if q else 200.0)) / 1000
    active = 2
    cfg = Config(
        active=active,
        build_s=build_s,
        wait=a.wait if a.wait is not None else (0.3 if q else 3.0),
        rate=a.rate or f"{max(1, round(active / build_s))} per second",
        burst_keys=a.burst_keys if a.burst_keys is not None else (20 if q else 40),
        steady_s=a.steady_s if a.steady_s is not None else (0.5 if q else 3.0),
        herd=a.herd if a.herd is not None else (20 if q else 50),
        idle_s=a.idle_s if a.idle_s is not None else (0.2 if q else 1.0),
        warm_interval_s=(a.warm_ms if a.warm_ms is not None else 10.0) / 1000,
        warm_cap=a.warm_cap if a.warm_cap is not None else (200 if q else 800),
        client_timeout_s=a.timeout if a.timeout is not None else (10.0 if q else 30.0),
        settle_s=FIXED_WINDOW_S,
    )
    policies, scenarios = _common.selection(p, a, POLICIES, SCENARIOS)
    if cfg.build_s <= 0 or cfg.wait <= 0 or cfg.steady_s <= 0 or cfg.idle_s <= 0:
        p.error("need --build-ms > 0, --wait > 0, --steady-s > 0, --idle-s > 0")
    if min(cfg.burst_keys, cfg.herd, cfg.warm_cap) < 1 or cfg.client_timeout_s <= 0:
        p.error("need --burst-keys >= 1, --herd >= 1, --warm-cap >= 1, --timeout > 0")
    if cfg.warm_interval_s <= 0:
        p.error("need --warm-ms > 0")

    skipped = _http.skip_flask_limiter(policies, "pip install Flask-Limiter", a.json)

    where = machine()  # the load average before this run adds its own
    if skipped:
        where["flask_limiter"] = None
    # SIGTERM (``timeout``, a CI runner) unwinds like Ctrl-C: every server is stopped by PID.
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(128 + signal.SIGTERM))
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    idles: list[dict[str, Any]] = []
    goals: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="reachlimit-http-load-") as tmp:
        for policy in policies:
            rows, idle = run_policy(policy, scenarios, cfg, Path(tmp))
            results += rows
            idles.append(idle)
            goals.append(judge(policy, rows, idle, cfg))
    report: dict[str, Any] = {
        "machine": where,
        "config": {
            **cfg.__dict__,
            "threads": THREADS,
            "pool_threads": POOL_THREADS,
            "quick": q,
            "policies": policies,
            "scenarios": scenarios,
        },
        "skipped": skipped,
        "results": results,
        "idle": idles,
        "goals": goals,
        "holders": [g["policy"] for g in goals if g["all"]],
        "elapsed_s": time.perf_counter() - started,
    }
    if a.plot is not None:
        plots.http_load(report, a.plot)
    print(json.dumps(report, indent=2) if a.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
