"""The README's examples are run, so the documentation cannot drift from the code.

The Quick start's code block is executed as a module and its app answered through Flask's
test client; the Testing-your-app block is executed the same way and its test functions are
called (twice: the module's one ``ReachLimit`` serves a new app each time, as in a real
suite). The README's configuration table names every key the extension reads. The relative
links of README.md, webapp/README.md and every page of docs/ must name files that exist
and, for a Markdown file, one of its headings (the anchors a git host and MyST both give).
The docs' own examples run as doctests in the Sphinx build (.ci/run).
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Callable, Iterator

import pytest

from tests.support import ROOT
from tests.support.readme import README, code_block

pytestmark = pytest.mark.timeout(60)

#: Every Markdown document whose links are checked, relative to the repository root.
DOCUMENTS = sorted(
    str(p.relative_to(ROOT))
    for p in [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "webapp" / "README.md",
              *(ROOT / "docs").rglob("*.md")]
    if "_build" not in p.parts
)


def run_as_module(source: str, name: str) -> Iterator[types.ModuleType]:
    """``source`` executed as module ``name`` (in sys.modules while it is used: Flask looks
    its app's import name up there)."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(source, f"README.md ({name})", "exec"), module.__dict__)
        yield module
    finally:
        del sys.modules[name]


@pytest.fixture
def quick_start() -> Iterator[types.ModuleType]:
    yield from run_as_module(code_block(README.read_text(), "## Quick start"),
                             "readme_quick_start")


@pytest.fixture
def testing_example() -> Iterator[types.ModuleType]:
    yield from run_as_module(code_block(README.read_text(), "## Testing your app"),
                             "readme_testing_example")


def test_the_quick_start_builds_once_then_answers_from_the_cache(
    quick_start: types.ModuleType,
) -> None:
    client = quick_start.app.test_client()
    first = client.get("/reports/a")
    assert first.status_code == 200
    assert first.get_json() == {"key": "a", "rows": 42}
    assert first.headers["Cache-Status"] == "reachlimit; fwd=uri-miss; stored"
    again = client.get("/reports/a")
    assert again.get_json() == {"key": "a", "rows": 42}
    assert again.headers["Cache-Status"].startswith("reachlimit; hit; ttl=")

    totals = client.get("/totals/a")
    assert totals.status_code == 200
    assert totals.get_json() == {"totals": {"key": "a", "rows": 42}}
    assert totals.headers["Cache-Status"] == "reachlimit; fwd=uri-miss; stored"
    assert client.get("/totals/a").headers["Cache-Status"].startswith("reachlimit; hit;")

    health = client.get("/health")
    assert health.status_code == 200
    body = health.get_json()
    assert body["status"] == "ok"
    assert body["reach"]["builds"] == 2  # one per key: /reports/a and ("totals", "a")
    assert body["reach"]["hits"] == 2
    assert body["reach"]["capacity_active"] == 2
    assert body["reach"]["capacity_queue"] == 8


def test_the_testing_example_passes_and_can_run_again(
    testing_example: types.ModuleType,
) -> None:
    tests: list[Callable[[], None]] = [
        value for name, value in vars(testing_example).items()
        if name.startswith("test_") and callable(value)
    ]
    assert tests, "the Testing-your-app example has no test function"
    for _ in range(2):  # a new app each time, on the example's one ReachLimit
        for test in tests:
            test()


# -- links ------------------------------------------------------------------------------

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```$", re.MULTILINE | re.DOTALL)


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown``: lower case, punctuation but
    hyphens dropped, spaces made hyphens."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", _FENCE.sub("", markdown), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_the_configuration_table_has_every_key_the_extension_reads() -> None:
    from reachlimit.flask import CONFIG_KEYS

    text = README.read_text()
    section = text[text.index("## Configuration"):text.index("## Running under gunicorn")]
    rows = set(re.findall(r"^\| `(REACHLIMIT_[A-Z_]+)` \|", section, re.MULTILINE))
    assert rows == set(CONFIG_KEYS)


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 320  # the rest is in docs/


@pytest.mark.parametrize("document", DOCUMENTS)
def test_relative_links_name_files_and_headings_that_exist(document: str) -> None:
    path = ROOT / document
    text = path.read_text()
    broken = []
    for target in _LINK.findall(_FENCE.sub("", text)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
        elif ROOT not in linked.parents and linked != ROOT:
            broken.append(f"{target}: outside the repository")
    assert not broken, "\n".join(broken)
