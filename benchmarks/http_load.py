#!/usr/bin/env python3
"""Six admission policies over real HTTP, under gunicorn on 127.0.0.1, side by side: a burst,
a steady overload and a herd, with warm requests throughout.

    python benchmarks/http_load.py            # 200 ms builds, about a minute
    python benchmarks/http_load.py --quick    # tiny configuration, about 20 s
    python benchmarks/http_load.py --output http_load.json --plot http_load.png

For each policy, one gunicorn server (``_load.Server``: ``benchmarks/app.py``, ``-k gthread -w
1 --threads 16``; ``--threads 2`` for ``pool2``) on a free loopback port:

  none           no limiter: every cold miss builds at once
  pool2          the ``none`` app under ``--threads 2``: at most 2 of anything at once
  timed-sem      BoundedSemaphore(2).acquire(timeout=3), then 429
  refuse2        BoundedSemaphore(2).acquire(blocking=False): 429 at once when both are busy
  flask-limiter  Flask-Limiter, "10 per second" (the build capacity) on the route, in memory
  reachlimit     the reachlimit extension with its defaults: active 2, queue 8, wait 3 s

The scenarios (``_load.plan``), one after another on the same server, fresh cold keys each
time, the builds-at-once maximum reset in between, a new Flask-Limiter window before each:

  arrival  the control: 40 requests at once for warm keys, no cold work: what the arrival of
           40 requests costs one worker by itself
  burst    40 distinct cold keys at once
  steady   distinct cold keys arriving evenly at twice the build capacity for 3 s: the
           sustained cold saturation the warm goal is judged on
  herd     50 requests for one cold key at once

During every scenario, warm requests (cached keys, same route) start every 10 ms in threads of
their own (``_load.open_loop``); one counts as "under load" when it started before the
scenario's last cold answer came back. The same warm load with nothing else, for 1 s before
the first scenario and 1 s after the last, gives the idle warm p99.

Goals, judged per policy over every scenario: at most 2 builds in flight; refusal (429) p99 <=
100 ms; warm p99 during the steady overload <= 3x the idle warm p99, every warm request
answered 200; no 5xx, no other status, no transport error. The warm ratios of the other
scenarios and the herd's builds and refusals are reported, not judged. Flask-Limiter is
optional: without it its policy is skipped with a note (``skipped``).
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _load
import _report
import plots
from _load import Answer, Request, Server, Shape
from _report import fmt, ms, pct

POLICIES = ("none", "pool2", "timed-sem", "refuse2", "flask-limiter", "reachlimit")
SCENARIOS = ("arrival", "burst", "steady", "herd")
#: gunicorn's handler threads: reachlimit needs active + queue + 4 = 14; 16 is what webapp runs.
THREADS = 16
POOL_THREADS = 2
GOAL_REFUSAL_P99_MS = 100.0
GOAL_WARM_X_IDLE = 3.0
MAX_THREADS = 400
#: Flask-Limiter's default strategy is a fixed window of the rate's period (1 s here): each
#: scenario starts in a fresh window, so none inherits the previous one's count.
FIXED_WINDOW_S = 1.05
#: The goals' labels.
MARKS = (
    ("in_flight_within_limit", "in flight <= 2"),
    ("refusal_p99_le_100ms", f"429 p99 <= {GOAL_REFUSAL_P99_MS:g} ms"),
    ("warm_p99_within_3x_idle", f"warm p99 <= {GOAL_WARM_X_IDLE:g}x idle"),
    ("no_5xx_or_errors", "no 5xx/errors"),
)


@dataclass
class Config(_load.Budget):
    rate: str
    burst_keys: int
    steady_s: float
    herd: int
    idle_s: float
    warm_interval_s: float
    warm_cap: int
    client_timeout_s: float
    settle_s: float

    def shape(self) -> Shape:
        return Shape(self.capacity, self.burst_keys, self.steady_s, self.herd)


def server_of(policy: str, cfg: Config, log_dir: Path) -> Server:
    env = {"BENCH_POLICY": "none" if policy == "pool2" else policy,
           "BENCH_BUILD_MS": repr(cfg.build_s * 1000), "BENCH_RATE": cfg.rate,
           "REACHLIMIT_ACTIVE": str(cfg.active), "REACHLIMIT_WAIT": repr(cfg.wait)}  # fmt: skip
    return Server(policy, env, log_dir, threads=POOL_THREADS if policy == "pool2" else THREADS)


def warm_trickle(server: Server, kind: str, out: list[Answer], cfg: Config) -> Any:
    """Open-loop warm requests (one every ``warm_interval_s``, at most ``warm_cap``) for a
    ``with`` block; its yielded list says how many were still running at its end."""

    def send(i: int) -> None:
        path = f"/report?key={_load.WARM_KEYS[i % len(_load.WARM_KEYS)]}"
        out.append(_load.get(server.port, path, kind, cfg.client_timeout_s))

    return _load.open_loop(send, cfg.warm_interval_s, cfg.warm_cap,
                           cfg.client_timeout_s + _load.JOIN_MARGIN_S, kind)  # fmt: skip


def idle_warm(server: Server, cfg: Config) -> list[Answer]:
    out: list[Answer] = []
    with warm_trickle(server, "idle", out, cfg):
        time.sleep(cfg.idle_s)  # the phase measured, not a wait for a state
    return list(out)


def run_scenario(server: Server, policy: str, scenario: str, cfg: Config) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]  # fresh keys: nothing cached by an earlier scenario
    requests = _load.plan(scenario, cfg.shape(), tag)
    if len(requests) > MAX_THREADS:
        raise SystemExit(f"{scenario}: {len(requests)} requests is more than {MAX_THREADS}")
    server.wait_idle()
    time.sleep(cfg.settle_s if policy == "flask-limiter" else 0.1)  # a new window
    server.reset()
    reach_before = server.stats()["reach"]

    def send(_: int, req: Request) -> Answer:
        return _load.get(server.port, f"/report?key={req.key}", "cold", cfg.client_timeout_s)

    warm: list[Answer] = []
    with warm_trickle(server, "warm", warm, cfg) as warm_stuck:
        cold, stuck, t0 = _load.release(requests, send,
                                        cfg.client_timeout_s + _load.JOIN_MARGIN_S)
    server.wait_idle()
    herd_key = f"{tag}-herd" if scenario == "herd" else None
    after = server.stats(herd_key)
    last_cold = max((a.end for a in cold), default=t0)
    row: dict[str, Any] = {
        "scenario": scenario, "policy": policy, "threads": server.threads,
        "requests": len(requests), "stuck": stuck + warm_stuck[0],
        "elapsed_s": last_cold - t0, "max_in_flight": after["builds"]["max_in_flight"],
        **_load.cold_figures(cold),
        **_load.warm_figures([a for a in warm if a.start < last_cold], "warm"),
    }  # fmt: skip
    if herd_key is not None:
        row["herd_builds"] = after["builds"]["key_builds"]
    if reach_before is not None:
        reach = after["reach"]
        row["reach_reasons"] = {k: reach[k] - reach_before[k] for k in (
            "rejected_full", "rejected_timeout", "cancelled", "coalesced")}  # fmt: skip
    return row


def judge(policy: str, rows: list[dict[str, Any]], idle: dict[str, Any],
          cfg: Config) -> dict[str, Any]:  # fmt: skip
    """The four goals for one policy, from its scenario rows and its idle warm figures. The
    warm goal is judged on the steady overload; the other scenarios' ratios are beside it."""
    idle_p99 = idle["idle_p99_ms"]
    warm_x = {r["scenario"]: _report.ratio_of(r["warm_p99_ms"], idle_p99) for r in rows}
    warm_refused = {r["scenario"]: r["warm_samples"] - r["warm_status"]["200"] for r in rows}
    bad = sum(_load.bad(r[f]) for r in rows for f in ("status", "warm_status")) + _load.bad(
        idle["idle_status"])
    refused = [r["refused_p99_ms"] for r in rows if r["refused_p99_ms"] is not None]
    herd = next((r for r in rows if r["scenario"] == "herd"), None)
    g: dict[str, Any] = {
        "policy": policy,
        "max_in_flight": max((r["max_in_flight"] for r in rows), default=0),
        "refused_p99_ms": max(refused, default=None),
        "warm_x_idle": warm_x,
        "warm_refused": warm_refused,
        "bad_responses": bad,
        "herd_builds": herd["herd_builds"] if herd else None,
        "herd_refused": herd["status"]["429"] if herd else None,
    }
    steady = warm_x.get("steady")
    g["met"] = {
        "in_flight_within_limit": g["max_in_flight"] <= cfg.active,
        # No refusal at all meets it vacuously; the other goals judge such a policy.
        "refusal_p99_le_100ms": g["refused_p99_ms"] is None
        or g["refused_p99_ms"] <= GOAL_REFUSAL_P99_MS,
        # None: not judged (--scenarios without steady).
        "warm_p99_within_3x_idle": None if "steady" not in warm_x else (
            steady is not None and steady <= GOAL_WARM_X_IDLE and warm_refused["steady"] == 0),
        "no_5xx_or_errors": bad == 0 and not any(r["stuck"] for r in rows),
    }
    g["all"] = all(v is not False for v in g["met"].values())
    return g


def run_policy(policy: str, scenarios: list[str], cfg: Config,
               log_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    with _load.serving_all([server_of(policy, cfg, log_dir)]) as [server]:
        before = idle_warm(server, cfg)
        rows = [run_scenario(server, policy, s, cfg) for s in scenarios]
        server.wait_idle()
        after = idle_warm(server, cfg)
    return rows, {
        "policy": policy, "threads": server.threads, **_load.warm_figures(before + after, "idle"),
        # Each phase on its own, to show how noisy the machine was while this server ran.
        "idle_before_p99_ms": ms(pct(_load.latencies(before, 200), 99)),
        "idle_after_p99_ms": ms(pct(_load.latencies(after, 200), 99)),
    }  # fmt: skip


def render(report: dict[str, Any]) -> str:
    c = report["config"]
    out = [
        *_load.head(f"reachlimit HTTP load: {len(c['policies'])} policies, gunicorn gthread on "
                    "127.0.0.1", report),
        f"servers: -w 1 --threads {THREADS} (pool2: {POOL_THREADS}); flask-limiter "
        f'"{c["rate"]}"',
        f"         burst {c['burst_keys']} keys, steady {c['steady_s']:g} s at 2x capacity, "
        f"herd {c['herd']}; a warm request every {c['warm_interval_s'] * 1000:g} ms (open loop, "
        f"at most {c['warm_cap']}), idle {c['idle_s']:g} s before and after",
        "latency in ms, client side (connect to last byte); warm = warm requests started while "
        "cold requests were outstanding, answered 200; warm !200 = warm requests refused",
        "", *_load.skipped_notes(report),
    ]
    head = (f"{'policy':<13} {'inflt':>5} {'req':>4} {'200':>4} {'429':>4} {'5xx':>4} {'err':>4} "
            f"{'ok p50':>7} {'p99':>7} {'429 p50':>7} {'p99':>7} {'warm p50':>8} {'p99':>7} "
            f"{'!200':>5} {'x idle':>6}")
    idle = {i["policy"]: i for i in report["idle"]}

    def line(r: dict[str, Any]) -> str:
        st = r["status"]
        x = _report.ratio_of(r["warm_p99_ms"], idle[r["policy"]]["idle_p99_ms"])
        extra = f"  herd builds {r['herd_builds']}" if "herd_builds" in r else ""
        if "reach_reasons" in r:
            rr = r["reach_reasons"]
            extra += f"  (queue_full {rr['rejected_full']}, timeout {rr['rejected_timeout']})"
        extra += f"  errors {r['errors']}" if r["errors"] else ""
        extra += f"  STUCK {r['stuck']}" if r["stuck"] else ""
        return (f"{r['policy']:<13} {r['max_in_flight']:>5} {r['requests']:>4} {st['200']:>4} "
                f"{st['429']:>4} {st['5xx']:>4} {st['error'] + st['other']:>4} "
                f"{fmt(r['admitted_p50_ms']):>7} {fmt(r['admitted_p99_ms']):>7} "
                f"{fmt(r['refused_p50_ms']):>7} {fmt(r['refused_p99_ms']):>7} "
                f"{fmt(r['warm_p50_ms']):>8} {fmt(r['warm_p99_ms']):>7} "
                f"{r['warm_samples'] - r['warm_status']['200']:>5} {fmt(x):>6}" + extra)

    titles = _load.plan_titles(c)
    out += _load.scenario_tables(report["results"], {s: titles[s] for s in SCENARIOS}, head, line)
    out.append("idle warm (same server, no load, before and after the scenarios): samples, "
               "!200, p50, p99 ms; p99 before | after")
    for i in report["idle"]:
        out.append(f"  {i['policy']:<13} {i['idle_samples']:>5} "
                   f"{i['idle_samples'] - i['idle_status']['200']:>5} {fmt(i['idle_p50_ms']):>7} "
                   f"{fmt(i['idle_p99_ms']):>7}   {fmt(i['idle_before_p99_ms']):>5} | "
                   f"{fmt(i['idle_after_p99_ms'])}")  # fmt: skip
    out += ["", "goals over every scenario; warm judged on steady (x idle: warm p99 / idle warm "
            "p99 for arrival/burst/steady/herd; herd: its builds and refusals, not judged)"]

    def extra(g: dict[str, Any]) -> str:
        ratios = "/".join(fmt(g["warm_x_idle"].get(k)) for k in SCENARIOS)
        herd = "-" if g["herd_builds"] is None else f"{g['herd_builds']}b {g['herd_refused']}r"
        return f"  x idle {ratios}  herd {herd}"

    out += _load.goal_table(report["goals"], MARKS, "policy", extra)
    return _report.closing(out, report)


def main(argv: list[str] | None = None) -> int:
    p = _report.parser(_report.description(__doc__),
                       "tiny configuration (20 ms builds, 0.3 s wait, short scenarios): ~20 s")
    settle = _report.options(p, build_ms=(200.0, 20.0), wait=(3.0, 0.3), rate=None,
                             burst_keys=(40, 20), steady_s=(3.0, 0.5), herd=(50, 20),
                             idle_s=(1.0, 0.2), warm_ms=10.0, timeout=(30.0, 10.0))
    p.add_argument("--warm-cap", type=int, default=None,
                   help="most warm requests in one scenario or idle phase (default 800, quick 200)")
    p.add_argument("--policies", default=",".join(POLICIES), help=f"subset of {','.join(POLICIES)}")
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help=f"subset of {','.join(SCENARIOS)}")
    plots.add_option(p)
    a = p.parse_args(argv)
    settle(a)
    cfg = Config(
        active=2, queue=8, build_s=a.build_ms / 1000, wait=a.wait,
        rate=a.rate or f"{max(1, round(2000 / a.build_ms))} per second",
        burst_keys=a.burst_keys, steady_s=a.steady_s, herd=a.herd, idle_s=a.idle_s,
        warm_interval_s=a.warm_ms / 1000, warm_cap=a.warm_cap or (200 if a.quick else 800),
        client_timeout_s=a.timeout, settle_s=FIXED_WINDOW_S,
    )  # fmt: skip
    policies = _load.selection(p, a.policies, POLICIES, "policy")
    scenarios = _load.selection(p, a.scenarios, SCENARIOS, "scenario")
    if cfg.warm_cap < 1:
        p.error("need --warm-cap >= 1")
    skipped = _load.skip_flask_limiter(policies, a.json)
    report = _report.start("http_load")
    _load.unwind_on_sigterm()
    results: list[dict[str, Any]] = []
    idles: list[dict[str, Any]] = []
    goals: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="reachlimit-http-load-") as tmp:
        for policy in policies:
            rows, idle = run_policy(policy, scenarios, cfg, Path(tmp))
            results += rows
            idles.append(idle)
            goals.append(judge(policy, rows, idle, cfg))
    report.update(
        config={**asdict(cfg), "threads": THREADS, "pool_threads": POOL_THREADS,
                "quick": a.quick, "policies": policies, "scenarios": scenarios},
        skipped=skipped, results=results, idle=idles, goals=goals,
        holders=[g["policy"] for g in goals if g["all"]],
        figures={
            "policies holding every goal": ", ".join(g["policy"] for g in goals if g["all"]),
            **{f"reachlimit {k}": v for g in goals if g["policy"] == "reachlimit" for k, v in (
                ("most builds at once", g["max_in_flight"]), ("429 p99 ms", g["refused_p99_ms"]),
                ("steady warm p99 x idle", g["warm_x_idle"].get("steady")),
                ("herd builds", g["herd_builds"]))},
        },
    )  # fmt: skip
    return _report.finish(report, a, render, plots.http_load)


if __name__ == "__main__":
    sys.exit(main())
