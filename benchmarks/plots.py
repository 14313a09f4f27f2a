#!/usr/bin/env python3
"""The figures of docs/benchmarks.md, drawn from the benchmarks' own results (matplotlib: the
``bench`` extra).

``figures.py`` draws every one from the results kept in ``benchmarks/results/``; a script run
with ``--plot PATH`` (``micro.py``, ``http_load.py``, ``fair_admission.py``) draws its own
result once it has run, and a result saved with ``--output`` can be drawn again later:

    python benchmarks/micro.py --output micro.json --plot micro.png
    python benchmarks/plots.py micro micro.json micro.png

Every figure says under it where it was made: the machine, the date, the commit and the load
average the result recorded (other processes on the cores move the absolute figures; the
ratios and the shares are what the pages judge).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Colours, one per compared thing, the same in every figure: the baseline grey, reachlimit blue.
BASELINE = "#9e9e9e"
REACHLIMIT = "#1f77b4"
OTHERS = ("#ff7f0e", "#2ca02c", "#d62728", "#8c564b", "#e377c2")
GOAL = "#d62728"


def add_option(p: argparse.ArgumentParser) -> None:
    """``--plot PATH`` on a script's parser."""
    p.add_argument(
        "--plot",
        type=Path,
        metavar="PATH",
        default=None,
        help="also draw the report as a PNG at PATH (needs matplotlib: pip install -e '.[bench]')",
    )


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as e:  # the bench extra is not installed
        raise SystemExit(f"--plot needs matplotlib (pip install -e '.[bench]'): {e}") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def stamp(report: dict[str, Any]) -> str:
    """The line under a figure: the machine, the date, the commit and the load the result
    recorded."""
    m = report["machine"]
    end = m.get("loadavg_end", ["?"])[0]
    return (f"{m['cpu']}, {m['cores']} cores, {m['python']}; {report['date']}, commit "
            f"{report['commit']}; 1-minute load average {m['loadavg'][0]} -> {end}")


def _save(fig: Any, report: dict[str, Any], path: Path) -> None:
    fig.text(0.01, 0.005, stamp(report), fontsize=7, color="#555555", ha="left", va="bottom")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def _legend(fig: Any, ax: Any, columns: int) -> None:
    """The legend of ``ax``'s bars under the panels, in one row."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 0.03))  # fmt: skip


# -- micro.py ---------------------------------------------------------------------------------

def _ratio_bars(ax: Any, rows: list[tuple[str, dict[str, Any], float | None]]) -> None:
    """One bar a pair, top down: the median of the rounds' ratios, whiskers over the
    quartiles, the goal as a red mark; ``rows`` are (label, figures, goal)."""
    ys = list(range(len(rows)))[::-1]
    for y, (_label, r, most) in zip(ys, rows, strict=True):
        lo, hi = r["ratio_iqr"]
        ax.barh(y, r["ratio"], color=REACHLIMIT, height=0.6)
        ax.errorbar(r["ratio"], y, xerr=[[r["ratio"] - lo], [hi - r["ratio"]]], color="black",
                    capsize=3, lw=1)  # fmt: skip
        ax.text(max(hi, r["ratio"], most or 0) + 0.05, y, f"{r['ratio']:.2f}x", va="center",
                fontsize=8)  # fmt: skip
        if most is not None:
            ax.plot([most, most], [y - 0.4, y + 0.4], color=GOAL, lw=2)
    ax.axvline(1.0, color=BASELINE, ls="--", lw=1)
    ax.set_yticks(ys, [label for label, _r, _m in rows], fontsize=8)
    ax.set_xlim(0, max(2.0, max(r["ratio_iqr"][1] for _l, r, _m in rows) + 0.6))
    ax.set_xlabel("subject / baseline, timed in turn (median of the rounds, quartiles; lower is "
                  "better; red: the goal)", fontsize=8)  # fmt: skip


def ratios(reports: list[dict[str, Any]], path: Path) -> None:
    """Every pair of every paired result, one bar each, grouped by result."""
    plt = _pyplot()
    rows: list[tuple[str, dict[str, Any], float | None]] = []
    for report in reports:
        parts = report["modes"] if "modes" in report else {
            "": {"results": report.get("results") or report.get("fresh_hit")}}
        goals = {g["pair"]: float(g["target"].split()[-1].rstrip("x")) for g in
                 report.get("goals", []) if g.get("pair") and g["target"].startswith("<=")}
        for mode, part in parts.items():
            for key, r in part["results"].items():
                if isinstance(r, dict) and "ratio_iqr" in r:
                    name = f"{mode}/{key}" if mode else key
                    rows.append((f"{report['benchmark']}: {name}", r, goals.get(name)))
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(rows) + 1.4))
    _ratio_bars(ax, rows)
    ax.set_title("every paired ratio", fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    _save(fig, reports[0], path)


#: micro.py's pairs: result key, label, the goal's highest ratio (None: shown, not judged).
MICRO_ROWS = (
    ("fast_path", "fast path: acquire + release\nvs BoundedSemaphore(2) pair", 1.0),
    ("fast_path_with", "fast path, with-block\nvs with BoundedSemaphore(2)", None),
    ("refusal_gate", "queue_full refusal, gate full\nvs refused Queue.put_nowait", 1.35),
    ("refusal_queue0", "queue_full refusal, queue=0\nvs refused Queue.put_nowait", 1.35),
    ("flask_refusal", "429 through the Flask extension\nvs a constant-JSON route", 1.2),
)


def micro(report: dict[str, Any], path: Path) -> None:
    """One bar a pair of micro.py (its ratio, quartiles and goal)."""
    plt = _pyplot()
    rows = [(label, report["results"][k], most) for k, label, most in MICRO_ROWS
            if k in report["results"]]  # fmt: skip
    fig, ax = plt.subplots(figsize=(8, 0.9 * len(rows) + 1.6))
    _ratio_bars(ax, rows)
    c = report["config"]
    ax.set_title(f"micro.py: the hot paths as ratios ({c['rounds']} alternating rounds in "
                 f"{c['processes']} processes)", fontsize=10)  # fmt: skip
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    _save(fig, report, path)


# -- http_load.py -----------------------------------------------------------------------------


def _colour(policy: str, i: int) -> str:
    return REACHLIMIT if policy == "reachlimit" else OTHERS[i % len(OTHERS)]


def http_load(report: dict[str, Any], path: Path) -> None:
    """Per policy and scenario: the most builds in flight (the limit as a line), the warm p99
    against the idle warm p99 (3x as a line), and the refusal p99 (100 ms as a line)."""
    plt = _pyplot()
    c = report["config"]
    policies = c["policies"]
    scenarios = [s for s in c["scenarios"] if s != "arrival"] or c["scenarios"]
    idle = {i["policy"]: i["idle_p99_ms"] for i in report["idle"]}
    rows = {(r["policy"], r["scenario"]): r for r in report["results"]}

    def warm_x(r: dict[str, Any]) -> float | None:
        base = idle.get(r["policy"])
        return r["warm_p99_ms"] / base if r["warm_p99_ms"] is not None and base else None

    panels: tuple[tuple[str, Callable[[dict[str, Any]], float | None], float, bool], ...] = (
        ("most builds in flight", lambda r: r["max_in_flight"], c["active"], False),
        ("warm p99 / idle warm p99", warm_x, 3.0, True),
        ("refusal (429) p99, ms", lambda r: r["refused_p99_ms"], 100.0, True),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 4))
    width = 0.8 / len(policies)
    for ax, (title, figure, goal, log) in zip(axes, panels, strict=True):
        for i, policy in enumerate(policies):
            xs, vs = [], []
            for j, s in enumerate(scenarios):
                row = rows.get((policy, s))
                v = figure(row) if row is not None else None
                if v is not None:
                    xs.append(j + (i - (len(policies) - 1) / 2) * width)
                    vs.append(v)
            ax.bar(xs, vs, width, label=policy, color=_colour(policy, i))
        ax.axhline(goal, color=GOAL, ls="--", lw=1)
        ax.set_xticks(range(len(scenarios)), scenarios)
        ax.set_title(title, fontsize=10)
        if log:
            ax.set_yscale("log")
    _legend(fig, axes[0], len(policies))
    fig.suptitle(f"http_load.py: six policies under gunicorn ({c['build_s'] * 1000:g} ms "
                 f"builds, active {c['active']}; red: the goal)", fontsize=10)  # fmt: skip
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    _save(fig, report, path)


# -- fair_admission.py ------------------------------------------------------------------------


def fair_admission(report: dict[str, Any], path: Path) -> None:
    """Per set-up, ``REACHLIMIT_CLIENT=none`` against ``remote_addr``: the polite clients'
    first-try admission (95 % as a line), the crawler's share of the builds, goodput (90 % as
    a line) and the most builds at once (the limit as a line); rounds averaged."""
    plt = _pyplot()
    c = report["config"]
    setups, variants = c["setups"], c["variants"]

    def mean(setup: str, variant: str, field: str) -> float | None:
        vs = [r[field] for r in report["results"]
              if r["setup"] == setup and r["variant"] == variant and r[field] is not None]
        return sum(vs) / len(vs) if vs else None  # fmt: skip

    panels = (
        ("polite clients admitted\nat their first try, %", "polite_first_try_pct", 95.0),
        ("crawler's share of\nthe builds, %", "crawler_share_pct", None),
        ("goodput, % of\nactive / build time", "goodput_pct", 90.0),
        ("most builds at once", "max_in_flight", c["active"]),
    )
    colours = {"none": BASELINE, "remote_addr": REACHLIMIT}
    labels = {"none": "none (one plain FIFO queue)", "remote_addr": "remote_addr (fair)"}
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 3.8))
    width = 0.8 / len(variants)
    names = {"single": "1 worker", "shared": f"{c['servers']}x{c['workers']} on Redis"}
    for ax, (title, field, goal) in zip(axes, panels, strict=True):
        for i, variant in enumerate(variants):
            xs, vs = [], []
            for j, setup in enumerate(setups):
                v = mean(setup, variant, field)
                if v is not None:
                    xs.append(j + (i - (len(variants) - 1) / 2) * width)
                    vs.append(v)
            bars = ax.bar(xs, vs, width, color=colours.get(variant, OTHERS[i]),
                          label=labels.get(variant, variant))  # fmt: skip
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
        if goal is not None:
            ax.axhline(goal, color=GOAL, ls="--", lw=1)
        ax.set_xticks(range(len(setups)), [names.get(s, s) for s in setups], fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.margins(y=0.15)
    _legend(fig, axes[0], len(variants))
    fig.suptitle(f"fair_admission.py: a crawler ({c['crawler_connections']} connections) "
                 f"against {c['polite']} polite clients, {c['duration_s']:g} s each "
                 "(red: the goal)", fontsize=10)  # fmt: skip
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    _save(fig, report, path)


DRAWERS: dict[str, Callable[[dict[str, Any], Path], None]] = {
    "micro": micro,
    "http_load": http_load,
    "fair_admission": fair_admission,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Draw a benchmark's saved --json report as a PNG.")
    p.add_argument("kind", choices=sorted(DRAWERS), help="the script that wrote the report")
    p.add_argument("report", type=Path, help="the report, as the script's --json printed it")
    p.add_argument("png", type=Path, help="where to write the figure")
    a = p.parse_args(argv)
    DRAWERS[a.kind](json.loads(a.report.read_text()), a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
