"""Fixtures shared by the whole suite: thin wrappers over ``tests/support`` (see its
README.md), ``reachlimit_log`` (the library's log captured down to INFO), plus the demo
database and webapps of the service's tests.

Concurrency tests here follow three rules:

* A test waits for a *state* (``tests.support.waiting.wait_until``: poll a predicate, bounded
  timeout), never for a length of time. A sleep is never the thing that makes a test pass.
* Every thread a test starts goes through the ``threads`` fixture, which joins each one with a
  timeout and fails the test if any is still alive or died with an unexpected exception.
* Where a deadline or a TTL matters, the clock is injected (``fake_clock``), so time moves only
  when the test says so.

It also puts the repository root on ``sys.path``, so that every test module can import the
helpers in ``tests/`` (``tests.support``, ``tests.apps``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the helpers live in tests/, beside this file
    sys.path.insert(0, str(ROOT))

from reachlimit import ColdPath  # noqa: E402
from tests.support import refreshes  # noqa: E402
from tests.support.clock import FakeClock  # noqa: E402
from tests.support.threads import ThreadRunner  # noqa: E402

refreshes.install()  # every refresh job watched, so a test can wait for one to end

#: The helper modules whose fixtures every test module may ask for by name, registered once
#: here instead of imported (with a noqa for the unused name) into each module using them. A
#: fixture is only set up for a test that asks for it, and a module's own fixture of the same
#: name (``client`` in ``tests/test_redis_stress.py``, say) still wins over these.
pytest_plugins = (
    "tests.support.flask_ext",  # apps
    "tests.support.redis_server",  # redis_server (module-scoped)
    "tests.support.redis_clients",  # make_client, client, live_redis
    "tests.support.redis_limiters",  # make_limiter, factory
    "tests.support.redis_procs",  # start_workers
    "tests.support.redis_fallback",  # make_stack, server, redis_app, runner
    "tests.support.fair_app",  # make
    "tests.support.browser",  # live_server, slot, browser, page
    "tests.support.mesh",  # mesh
    "tests.support.reach_app",  # busy_repeater
)


@pytest.fixture
def threads() -> Iterator[ThreadRunner]:
    """A :class:`ThreadRunner`; at teardown every thread is joined with a timeout and the test
    fails if one is still alive or raised an exception the test did not take."""
    runner = ThreadRunner()
    yield runner
    runner.join_all()


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def reachlimit_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """``caplog`` with the ``reachlimit`` logger's INFO records captured too (what it says of
    Redis going and coming back, of the claims and outcomes it dropped or published late),
    for the test that reads them."""
    caplog.set_level(logging.INFO, logger="reachlimit")
    return caplog


@pytest.fixture
def paths() -> Iterator[list[ColdPath]]:
    """The ColdPaths a test makes (it appends them): closed at teardown, and no thread of
    their refreshers left alive."""
    yield from refreshes.closed_paths()


# -- webapp: tests/test_reach.py, tests/test_webapp.py -------------------------------------------

#: The fixed "now" of the session's demo database and of the webapps built on it.
REACH_DEMO_NOW = 1_780_000_000


@pytest.fixture(scope="session")
def reach_demo_db(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny deterministic demo database (150 nodes, 6,000 observations) as a
    ``pathlib.Path``, written once per session. Treat it as read-only."""
    from webapp.demodb import write_demo_db

    path = tmp_path_factory.mktemp("reach-demo") / "demo.sqlite"
    write_demo_db(path, nodes=150, observations=6_000, seed=7, now=REACH_DEMO_NOW)
    return path


@pytest.fixture
def reach_app_factory(reach_demo_db: Any, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """``reach_app_factory(**config)``: a webapp on the session demo database whose reports
    end at REACH_DEMO_NOW. The test run's own REACH_* / REACHLIMIT_* environment is ignored."""
    import os

    from webapp import create_app

    for key in list(os.environ):
        if key.startswith(("REACH_", "REACHLIMIT_")):
            monkeypatch.delenv(key)

    def make(**config: Any) -> Any:
        settings: dict[str, Any] = {
            "REACH_DB": str(reach_demo_db),
            "REACH_WALL_CLOCK": lambda: float(REACH_DEMO_NOW),
        }
        settings.update(config)
        return create_app(settings)

    return make


@pytest.fixture
def reach_app(reach_app_factory: Callable[..., Any]) -> Any:
    return reach_app_factory()


@pytest.fixture
def reach_client(reach_app: Any) -> Any:
    with reach_app.test_client() as client:
        yield client
