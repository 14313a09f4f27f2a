#!/usr/bin/env python3
"""The latest figures of benchmarks/README.md and docs/benchmarks.md, made from the results kept
in benchmarks/results/ (each written by a script's ``--output``), never typed.

    python benchmarks/figures.py            # rewrite both pages' tables, redraw the plots
    python benchmarks/figures.py --check    # exit status 1 if a page's tables are not the
                                            # results' (the test suite runs this)

Each page holds its generated part between ``<!-- figures:start -->`` and ``<!-- figures:end
-->``: the runs (where, when, at which commit, the load at the start and the end), every
paired ratio with its quartiles and its goal, the load runs' headline figures and their goals,
and the soak's runs. The plots (``plots.py``, matplotlib) go to docs/_static/bench/.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PAGES = (HERE / "README.md", HERE.parent / "docs" / "benchmarks.md")
START, END = "<!-- figures:start -->", "<!-- figures:end -->"


def results() -> dict[str, dict[str, Any]]:
    """Every kept result, by its file's name."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}


def fmt(x: Any, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec) if isinstance(x, float) else str(x)


def runs(found: dict[str, dict[str, Any]]) -> list[str]:
    """Where and when the results were made: the machine, and each result's date, commit and
    1-minute load average at its start and its end (the machine may be shared)."""
    machines = sorted({f"{r['machine']['cpu']}, {r['machine']['cores']} cores, "
                       f"{r['machine']['python']}" for r in found.values()})  # fmt: skip
    each = []
    for name, r in found.items():
        m = r["machine"]
        commit = (r["commit"] or "unknown commit") + (" with changes" if r["dirty"] else "")
        each.append(f"{name} ({r['date']}, {commit}, load {m['loadavg'][0]} -> "
                    f"{m['loadavg_end'][0]})")  # fmt: skip
    text = f"Made on {'; '.join(machines)}: " + "; ".join(each) + "."
    return textwrap.wrap(text, 96, break_on_hyphens=False)


def paired_rows(name: str, r: dict[str, Any]) -> list[str]:
    """One row a pair of a paired result: its ratio's median and quartiles, and its goal."""
    parts = r["modes"].items() if "modes" in r else [("", {"results": r.get("results") or
                                                          r.get("fresh_hit")})]
    goals: dict[str, list[dict[str, Any]]] = {}
    for g in r.get("goals", []):
        goals.setdefault(g.get("pair"), []).append(g)
    out = []
    for mode, part in parts:
        for key, row in part["results"].items():
            if not isinstance(row, dict) or "ratio_iqr" not in row:
                continue
            full = f"{mode}/{key}" if mode else key
            goal = "; ".join(f"{g['target']}: {'met' if g['met'] else 'missed'}"
                             for g in goals.get(full, [])) or "-"
            lo, hi = row["ratio_iqr"]
            out.append(f"| {name} | {full} | {row['ratio']:.2f}x | {lo:.2f}-{hi:.2f} | "
                       f"{row['rounds']} | {goal} |")  # fmt: skip
    return out


def load_rows(name: str, r: dict[str, Any]) -> list[str]:
    """One row a headline figure of a result but its ratios (its ``figures``)."""
    return [f"| {name} | {k} | {fmt(v)} |" for k, v in r.get("figures", {}).items()
            if not k.endswith(" ratio")]


def soak_row(r: dict[str, Any]) -> str:
    """One soak run's row: its faults, answers, latency, builds at once, stale, burst, checks."""
    a, st = r["answers"], r["answers"]["status"]
    kinds = Counter(f["kind"] for f in r["faults"])
    redis_windows = [w for w in r["windows"] if w["kind"] != "kill_worker"]
    peaks = Counter(w["peak"] for w in redis_windows)
    above = [w["over_bound_ms"] for w in redis_windows if w["over_bound_ms"]]
    burst = r["burst"]
    missed = [c["check"] for c in r["checks"] if not c["met"]]
    return (
        f"| {'Sentinel, ' if r['config'].get('sentinel') else ''}seed {r['seed']}, "
        f"{r['load_s'] / 60:.1f} min | {len(r['faults'])}: "
        + ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(kinds.items()))
        + f" | {st.get('200', 0)} / {st.get('429', 0)} / {st.get('500', 0)} / "
        f"{st.get('error', 0)} | {a['p50_ms']:.1f} / {a['p99_ms']:.0f} / {a['max_ms']:.0f} "
        f"| {r['builds']['peak_outside']} | "
        + ", ".join(f"{p}: {n}" for p, n in sorted(peaks.items()))
        + (f" (above {r['config']['window_bound']} and what the outage carried in, for "
           f"{', '.join(map(str, above))} ms)" if above else "")
        + f" | {fmt(r['stale']['oldest_s'], '.1f')} s | {burst.get('granted', '-')} of "
        f"{burst.get('keys', '-')} | {'; '.join(missed) or 'none'} |"
    )


def block(found: dict[str, dict[str, Any]]) -> str:
    """The generated part of both pages."""
    paired = [r for r in found.items() if "benchmarks" in r[1]]
    soaks = [r for n, r in found.items() if r["benchmark"] == "soak"]
    load = [r for r in found.items() if r[1]["benchmark"] != "soak"]
    out = [START, "", *runs(found), "",
           "Paired ratios (subject / baseline; the median of the rounds, the quartiles):", "",
           "| result | pair | ratio | quartiles | rounds | goal |", "|---|---|---|---|---|---|"]
    for name, r in paired:
        out += paired_rows(name, r)
    out += ["", "Load runs (their headline figures; every figure is in the result):", "",
            "| result | figure | value |", "|---|---|---|"]
    for name, r in load:
        out += load_rows(name, r)
    if soaks:
        out += ["", "Soak runs (answers 200 / 429 / 500 / transport errors; latency p50 / p99 / "
                "max ms; Redis windows by their peak):", "",
                "| run | faults | answers | latency | most at once outside the windows | "
                "Redis windows | oldest popular answer | final burst | checks not met |",
                "|---|---|---|---|---|---|---|---|---|", *map(soak_row, soaks)]
    return "\n".join([*out, "", END])


def spliced(text: str, new: str) -> str:
    before, rest = text.split(START, 1)
    return before + new + rest.split(END, 1)[1]


def draw(found: dict[str, dict[str, Any]]) -> None:
    import plots

    out = HERE.parent / "docs" / "_static" / "bench"
    for name, drawer in plots.DRAWERS.items():
        if name in found:
            drawer(found[name], out / f"{name}.png")
    plots.ratios([r for r in found.values() if "benchmarks" in r], out / "ratios.png")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--check", action="store_true",
                   help="only check that the pages' tables are the results' (exit status 1 if not)")
    args = p.parse_args(argv)
    found = results()
    new = block(found)
    stale = [page for page in PAGES if spliced(page.read_text(), new) != page.read_text()]
    if args.check:
        for page in stale:
            print(f"{page}: its figures are not the results' (run benchmarks/figures.py)",
                  file=sys.stderr)
        return 1 if stale else 0
    for page in stale:
        page.write_text(spliced(page.read_text(), new))
    draw(found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
