#!/usr/bin/env python3
"""Two results of one benchmark side by side: before and after a change.

    python benchmarks/micro.py --output before.json
    ... the change ...
    python benchmarks/micro.py --output after.json
    python benchmarks/compare.py before.json after.json

It prints where and when each ran (the commit, the version, the machine, the load average at
the start and the end: a comparison across machines, or across very different loads, says
little), then every pair's ratio before and after (the median of the rounds, their quartiles,
the change) with pyperf's verdict on whether the change is significant (``python -m pyperf
compare_to``: Student's two-sample t-test at 95 % over the rounds' ratios, which needs as many
rounds on both sides), then the result's
other headline figures (``figures``: load runs have one value each, so no test is made).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import _report

NOT_SIGNIFICANT = "Benchmark hidden because not significant"


def significance(before: Path, after: Path) -> dict[str, bool]:
    """pyperf's verdict for each benchmark of both results: ``compare_to`` prints the ones
    that differ significantly as ``NAME: Mean +- std dev: ...`` and names the others on one
    line (its output, the public face of its test, is read here; ``tests/test_benchmarks.py``
    runs this on two real results)."""
    proc = subprocess.run([sys.executable, "-m", "pyperf", "compare_to", str(before), str(after)],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    verdict: dict[str, bool] = {}
    for line in proc.stdout.splitlines():
        if line.startswith(NOT_SIGNIFICANT):
            verdict.update(dict.fromkeys(line.split("): ", 1)[1].split(", "), False))
        elif ": Mean +- std dev: " in line:
            verdict[line.split(": ", 1)[0]] = True
    return verdict


def where(label: str, r: dict[str, Any]) -> str:
    m = r["machine"]
    end = m.get("loadavg_end") or ["?"]
    return (f"{label:<7} {r['benchmark']} at {r['commit'] or 'unknown commit'}"
            f"{' (dirty)' if r['dirty'] else ''}, reachlimit {r['reachlimit_version']}, "
            f"{r['date']}; {m['cpu']}, {m['cores']} cores; load {m['loadavg'][0]} -> {end[0]}")


def ratios(path: Path) -> dict[str, list[float]]:
    """The rounds' ratios of every pair of a paired result, by benchmark name (the pyperf
    benchmarks in the dimensionless unit); none in a load run's result."""
    import pyperf

    if "benchmarks" not in json.loads(path.read_text()):
        return {}
    suite = pyperf.BenchmarkSuite.load(str(path))
    return {b.get_name(): list(b.get_values()) for b in suite if b.get_unit() == "integer"}


def cell(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return f"{statistics.median(values):.3f}x [{q[0]:.2f}-{q[2]:.2f}]"


def change(before: Any, after: Any) -> str:
    if not isinstance(before, int | float) or not isinstance(after, int | float) or not before:
        return "-"
    return f"{(after - before) / before * 100:+.1f}%"


def compare(before_path: Path, after_path: Path) -> str:
    before = json.loads(before_path.read_text())
    after = json.loads(after_path.read_text())
    out = [where("before", before), where("after", after)]
    if before["benchmark"] != after["benchmark"]:
        out.append("note: two different benchmarks")
    if (before["machine"]["cpu"], before["machine"]["cores"]) != (
            after["machine"]["cpu"], after["machine"]["cores"]):
        out.append("note: two different machines: the ratios may still compare, the times not")
    a, b = ratios(before_path), ratios(after_path)
    common = [k for k in a if k in b]
    if common:
        verdict = significance(before_path, after_path)
        head = (f"{'pair':<32} {'before':>22} {'after':>22} {'change':>8}  significant "
                "(pyperf, t-test)")
        out += ["", "ratio: median of the rounds [quartiles]", *_report.ruled(head)]
        for k in common:
            sig = {True: "yes", False: "no"}.get(verdict.get(k), "?")
            if len(a[k]) != len(b[k]):  # pyperf's t-test pairs samples of one size
                sig = "n/a: rounds differ"
            medians = statistics.median(a[k]), statistics.median(b[k])
            out.append(f"{k:<32} {cell(a[k]):>22} {cell(b[k]):>22} "
                       f"{change(*medians):>8}  {sig}")
    fa, fb = before.get("figures", {}), after.get("figures", {})
    others = [k for k in fa if k in fb and not k.endswith(" ratio")]
    if others:
        head = f"{'figure':<48} {'before':>10} {'after':>10} {'change':>8}"
        out += ["", "figures (one value each: no test)", *_report.ruled(head)]
        for k in others:
            a, b = (_report.fmt(x, ".3g") if isinstance(x, float) else str(x)
                    for x in (fa[k], fb[k]))  # fmt: skip
            out.append(f"{k:<48} {a:>10} {b:>10} {change(fa[k], fb[k]):>8}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=_report.description(__doc__))
    p.add_argument("before", type=Path, help="a result (--output) of the code before")
    p.add_argument("after", type=Path, help="a result of the same benchmark after")
    args = p.parse_args(argv)
    print(compare(args.before, args.after))
    return 0


if __name__ == "__main__":
    sys.exit(main())
