"""Shared fixtures and helpers for the reachlimit test suite.

Concurrency tests here follow three rules:

* A test waits for a *state* (``wait_until``: poll a predicate, bounded timeout), never for a
  length of time. A sleep is never the thing that makes a test pass.
* Every thread a test starts goes through the ``threads`` fixture, which joins each one with a
  timeout and fails the test if any is still alive or died with an unexpected exception.
* Where a deadline or a TTL matters, the clock is injected (``FakeClock``), so time moves only
  when the test says so.

It also puts the repository root on ``sys.path``, so that every test module can import the
shared helpers in ``tests/`` (``tests.servers``, ``tests.helpers``, ``tests.apps``).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the shared helpers live in tests/, beside this file
    sys.path.insert(0, str(ROOT))

from reachlimit import Grant  # noqa: E402
from tests import servers  # noqa: E402

#: How long a test waits for a state it expects, or for a thread to finish, before failing.
#: Generous on purpose: it only matters when something is already wrong.
STATE_TIMEOUT = 5.0


# -- waiting for a state --------------------------------------------------------------------


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = STATE_TIMEOUT,
    message: str | None = None,
    interval: float = 0.001,
) -> None:
    """Poll ``predicate`` until it is true; raise ``AssertionError`` after ``timeout`` seconds.

    The poll interval is tiny and only spaces the reads of a state; the test's outcome never
    depends on it. ``AssertionError`` (not ``pytest.fail``) so that the mutant checks in
    ``test_limiter.py`` can catch it like any other failed assertion. The loop is
    :func:`tests.servers.wait_until`'s, with the predicate first and a shorter default wait.
    """
    servers.wait_until(message or predicate, predicate, timeout=timeout, interval=interval)


@pytest.fixture(name="wait_until")
def wait_until_fixture() -> Callable[..., None]:
    return wait_until


# -- threads --------------------------------------------------------------------------------


class ThreadRunner:
    """Starts daemon threads and remembers them, so that none can outlive its test unseen.

    An exception escaping a thread's function is recorded; the fixture fails the test with it
    unless the test took it with :meth:`take_errors`.
    """

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []
        self._errors: list[tuple[str, BaseException]] = []
        self._lock = threading.Lock()

    def start(
        self, fn: Callable[..., Any], *args: Any, name: str | None = None, **kwargs: Any
    ) -> threading.Thread:
        thread_name = name or getattr(fn, "__name__", "worker")

        def run() -> None:
            try:
                fn(*args, **kwargs)
            except BaseException as exc:  # recorded, reported at join
                with self._lock:
                    self._errors.append((thread_name, exc))

        thread = threading.Thread(target=run, name=thread_name, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()
        return thread

    def join_all(self, timeout: float = STATE_TIMEOUT) -> None:
        """Join every thread started so far, within ``timeout`` seconds in all; fail (with
        ``AssertionError``) if any is still alive or raised."""
        with self._lock:
            threads, self._threads = self._threads, []
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            raise AssertionError(f"threads still alive after {timeout} s: {alive}")
        errors = self.take_errors()
        if errors:
            name, exc = errors[0]
            raise AssertionError(f"{len(errors)} thread(s) raised; first: {name}: {exc!r}") from exc

    def take_errors(self) -> list[tuple[str, BaseException]]:
        with self._lock:
            errors, self._errors = self._errors, []
        return errors


@pytest.fixture
def threads() -> Any:
    """A :class:`ThreadRunner`; at teardown every thread is joined with a timeout and the test
    fails if one is still alive or raised an exception the test did not take."""
    runner = ThreadRunner()
    yield runner
    runner.join_all()


# -- clocks ---------------------------------------------------------------------------------


class FakeClock:
    """A monotonic clock that moves only when told (``advance``), or by ``step`` after each
    read. Counts its reads, in all and per thread, so a test can prove a path never read it.
    """

    def __init__(self, start: float = 1000.0, step: float = 0.0) -> None:
        self._now = start
        self.step = step
        self._lock = threading.Lock()
        self.calls = 0
        self._calls_by_thread: Counter[int] = Counter()

    def __call__(self) -> float:
        with self._lock:
            self.calls += 1
            self._calls_by_thread[threading.get_ident()] += 1
            now = self._now
            self._now += self.step
            return now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def calls_from_this_thread(self) -> int:
        with self._lock:
            return self._calls_by_thread[threading.get_ident()]


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_clock() -> type[FakeClock]:
    """The class itself, for tests that need a clock with a ``step`` or several clocks."""
    return FakeClock


# -- limiter helpers ------------------------------------------------------------------------


class Attempt:
    """One ``limiter.acquire(cancel)`` call running in its own thread.

    ``done`` is set once the call returned (``grant``) or raised (``error``); the thread then
    ends, and the test releases ``grant`` itself (a grant may be released from any thread).
    """

    def __init__(
        self,
        limiter: Any,
        threads: ThreadRunner,
        cancel: Any = None,
        name: str = "attempt",
        on_grant: Callable[[Attempt], None] | None = None,
    ) -> None:
        self.limiter = limiter
        self.cancel = cancel
        self.name = name
        self.done = threading.Event()
        self.grant: Grant | None = None
        self.error: BaseException | None = None
        self._on_grant = on_grant
        threads.start(self._run, name=name)

    def _run(self) -> None:
        try:
            grant = self.limiter.acquire(self.cancel)
        except BaseException as exc:
            self.error = exc
            self.done.set()
            return
        self.grant = grant
        if self._on_grant is not None:
            self._on_grant(self)
        self.done.set()

    def wait_done(self, timeout: float = STATE_TIMEOUT) -> None:
        assert self.done.wait(timeout), f"{self.name}: acquire() did not return in {timeout} s"

    def release(self) -> None:
        assert self.grant is not None, f"{self.name} holds no grant"
        self.grant.release()


@pytest.fixture
def start_acquire(threads: ThreadRunner) -> Callable[..., Attempt]:
    """``start_acquire(limiter, cancel=None, name=...)`` -> a running :class:`Attempt`."""

    def start(
        limiter: Any,
        cancel: Any = None,
        name: str = "attempt",
        on_grant: Callable[[Attempt], None] | None = None,
    ) -> Attempt:
        return Attempt(limiter, threads, cancel=cancel, name=name, on_grant=on_grant)

    return start


class ProbeCancel:
    """A cancel object that reads "not set" once, then "set" for ever.

    ``acquire(ProbeCancel())`` therefore never blocks: the first read is the "already
    cancelled?" check, so a free slot is taken on the fast path; otherwise the caller is
    admitted (or refused) and, if admitted, gives up on its first look at the cancel object.
    It is how a test asks "is a slot free right now?" without risking a hang.
    """

    def __init__(self) -> None:
        self.calls = 0

    def is_set(self) -> bool:
        self.calls += 1
        return self.calls > 1


class Kit:
    """The helpers above in one object, for plain helper functions (such as the mutant checks
    in ``test_limiter.py``) that are called with it instead of requesting fixtures."""

    def __init__(self, threads: ThreadRunner) -> None:
        self.threads = threads
        self.wait_until = wait_until
        self.Clock = FakeClock
        self.ProbeCancel = ProbeCancel

    def start_acquire(
        self,
        limiter: Any,
        cancel: Any = None,
        name: str = "attempt",
        on_grant: Callable[[Attempt], None] | None = None,
    ) -> Attempt:
        return Attempt(limiter, self.threads, cancel=cancel, name=name, on_grant=on_grant)


@pytest.fixture
def kit(threads: ThreadRunner) -> Kit:
    return Kit(threads)


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
