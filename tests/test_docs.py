"""The documentation's artefacts that the Sphinx build does not check itself.

The Grafana dashboard (``docs/grafana/reachlimit.json``) asks only for series reachlimit
exports, with labels they have: every metric name and label in its queries is checked
against a real scrape of ``reachlimit.prometheus`` (an in-process budget and a shared one, so
that the Redis-only families are there too), and every ``result`` it filters on is a value
the library counts. The docs' pages and examples are built and run by ``.ci/run``
(``sphinx-build -W`` for HTML and for doctest); their links are checked by
``tests/test_readme_quickstart.py``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.support import ROOT

pytest.importorskip("prometheus_client")

DASHBOARD = ROOT / "docs" / "grafana" / "reachlimit.json"

#: The values of the ``result`` label, by family: what the library counts.
RESULTS = {
    "reachlimit_admissions_total": {"granted", "queue_full", "timeout", "cancelled",
                                    "displaced", "unavailable"},
    "reachlimit_cache_requests_total": {"hit", "miss", "stale"},
    "reachlimit_refreshes_total": {"done", "refused", "failed"},
}


def exported() -> dict[str, set[str]]:
    """Every series name a scrape can hold, with the labels of its samples."""
    from prometheus_client.parser import text_string_to_metric_families

    from reachlimit import ColdLimiter
    from reachlimit.prometheus import MetricsGroup, ReachMetrics

    group = MetricsGroup()
    local = ReachMetrics(budget="default", group=group)
    ReachMetrics(limiter=ColdLimiter(), budget="shared", group=group)
    local.path.get("k", lambda: "v")  # a build: one child of each labelled family
    local.path.get("k", lambda: "v")  # a hit
    series: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(group.exposition().decode()):
        names = {
            "counter": [f"{family.name}_total"],
            "histogram": [f"{family.name}_{s}" for s in ("bucket", "count", "sum")],
        }.get(family.type, [family.name])
        for name in names:
            series.setdefault(name, {"budget"})
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard: its panels' targets and its variables."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(variable["definition"])
    return exprs


def test_the_dashboard_asks_only_for_what_reachlimit_exports() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    series = exported()
    used: set[str] = set()
    for expr in queries(dashboard):
        for name in re.findall(r"\breachlimit_[a-z_]+", expr):
            assert name in series, (name, expr)
            used.add(name)
        for selector_name, selector in re.findall(r"\b(reachlimit_[a-z_]+)\{([^}]*)\}", expr):
            for label, value in re.findall(r'(\w+)=~?"([^"]*)"', selector):
                assert label in series[selector_name], (label, expr)
                if label == "result":
                    assert set(value.split("|")) <= RESULTS[selector_name], (value, expr)
        for grouped in re.findall(r"by \(([^)]*)\)", expr):
            assert {g.strip() for g in grouped.split(",")} <= {"budget", "result", "le"}, expr
    # Every family reachlimit exports has a panel (``_created`` is prometheus_client's
    # timestamp of a counter or histogram, not a figure of ours).
    def family(name: str) -> str:
        return re.sub(r"_(total|bucket|count|sum|created)$", "", name)

    missing = {family(n) for n in series} - {family(n) for n in used}
    assert not missing, sorted(missing)


def test_the_dashboard_is_one_grafana_dashboard_with_its_variables() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["uid"] == "reachlimit" and dashboard["panels"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "budget", "gauge_sum"}
    assert variables["gauge_sum"]["query"] == "sum,max"
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


MODULES = ("reachlimit", "reachlimit.flask", "reachlimit.redis", "reachlimit.prometheus",
           "reachlimit.gunicorn")


def test_the_api_reference_documents_every_public_name() -> None:
    """Every name in the ``__all__`` of each public module has its entry in the HTML that
    ``.ci/run`` built (``docs/_build/html``) before the tests."""
    import importlib
    import os

    pages = ROOT / "docs" / "_build" / "html" / "api"
    if not pages.is_dir():
        message = "docs/_build/html is not built: sphinx-build -b html docs docs/_build/html"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    html = "".join(p.read_text(encoding="utf-8") for p in pages.glob("*.html"))
    missing = [
        f"{name}.{member}"
        for name in MODULES
        for member in importlib.import_module(name).__all__
        if f'id="{name}.{member}"' not in html
    ]
    assert not missing, missing
